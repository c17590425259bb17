/* matmul_tmpl.h — the blocked f32 matmul, instantiated once per ISA by the arch file including it.
 *
 * The includer defines: V (vector type), VW (lanes), VZERO(), VLOAD(p), VLOADN(p, n) (first n lanes,
 * the rest zero), VFMA(a, b, acc) = a*b + acc, VSUM(v) (horizontal sum in a fixed order) and
 * FN(name) (adds the ISA suffix). Optionally WT (weight element type), WLOAD(p) and WLOADN(p, n)
 * (weights widened to V), for weights stored narrower than f32, and
 * IG_PREFETCH_L2(p) (bring the line at p towards the core, into L2; __builtin_prefetch otherwise).
 * With IG_DECODE_STREAMS (1 or 2) one activation row (decode) reads the weights row by row as that
 * many sequential streams (FN(dec_rows), below) instead of through the 1x8 tile, prefetching each
 * IG_PREFETCH_L1 (into L1) two rows ahead.
 *
 * Every dot product is computed one way only: one vector accumulator over K in VW-wide steps, the
 * tail through a zero-filled partial load, then VSUM. The 4x4 (prefill), 1x8 and dec_rows (decode)
 * tiles only decide how many dots share loads and in what order rows are read, never how one is
 * summed, so a row's result does not depend on T, on the tile that computed it, or on the thread
 * count.
 */

#define IG_NB 32   /* weight rows per parallel block: the block stays in L2 while x rows stream */
#ifndef IG_PREFETCH_L2
#define IG_PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#endif
#ifndef IG_PREFETCH_L1
#define IG_PREFETCH_L1(p) __builtin_prefetch((p), 0, 3)
#endif
#ifndef WT
#define WT float
#define WLOAD(p) VLOAD(p)
#define WLOADN(p, n) VLOADN(p, n)
#endif

static inline void FN(tile_1x8)(float *acc, const float *x, const WT *const *w, int K) {
    V a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
    V a4 = VZERO(), a5 = VZERO(), a6 = VZERO(), a7 = VZERO();
    int k = 0;
    for (; k + VW <= K; k += VW) {
        /* the next 8 rows (the next tile's) are read while these are summed: the hardware
         * prefetcher alone keeps too few lines in flight for 8 row streams */
        for (int j = 0; j < 8; j++) IG_PREFETCH_L2(w[j] + 8 * (size_t)K + k);
        const V xv = VLOAD(x + k);
        a0 = VFMA(WLOAD(w[0] + k), xv, a0);
        a1 = VFMA(WLOAD(w[1] + k), xv, a1);
        a2 = VFMA(WLOAD(w[2] + k), xv, a2);
        a3 = VFMA(WLOAD(w[3] + k), xv, a3);
        a4 = VFMA(WLOAD(w[4] + k), xv, a4);
        a5 = VFMA(WLOAD(w[5] + k), xv, a5);
        a6 = VFMA(WLOAD(w[6] + k), xv, a6);
        a7 = VFMA(WLOAD(w[7] + k), xv, a7);
    }
    if (k < K) {
        const int n = K - k;
        const V xv = VLOADN(x + k, n);
        a0 = VFMA(WLOADN(w[0] + k, n), xv, a0);
        a1 = VFMA(WLOADN(w[1] + k, n), xv, a1);
        a2 = VFMA(WLOADN(w[2] + k, n), xv, a2);
        a3 = VFMA(WLOADN(w[3] + k, n), xv, a3);
        a4 = VFMA(WLOADN(w[4] + k, n), xv, a4);
        a5 = VFMA(WLOADN(w[5] + k, n), xv, a5);
        a6 = VFMA(WLOADN(w[6] + k, n), xv, a6);
        a7 = VFMA(WLOADN(w[7] + k, n), xv, a7);
    }
    acc[0] = VSUM(a0); acc[1] = VSUM(a1); acc[2] = VSUM(a2); acc[3] = VSUM(a3);
    acc[4] = VSUM(a4); acc[5] = VSUM(a5); acc[6] = VSUM(a6); acc[7] = VSUM(a7);
}

#ifdef IG_DECODE_STREAMS
/* Decode from memory reads at most what the memory sends one core, and the 1x8 tile does not get
 * that: its 8 rows are 8 short interleaved streams that start over every tile, and on this EPYC
 * (Zen 5) the hardware prefetcher keeps fewer lines in flight for them than for one long run. Here
 * a tile is one row of each stream, read whole, so each stream runs through the matrix in address
 * order: 151936 x 896 f32 from memory on one thread went from 27-32 to 36-39 GB/s, about a plain
 * read of the same bytes (benchmarks/RESULTS.md). A row still has its one accumulator, so its FMA
 * chain is latency-bound (VW lanes every 4 cycles); the out-of-order window overlaps the next row's
 * chain, which keeps up with memory but not with L2, so prefill keeps its tiles.
 * acc[s] = dot(x, w[s]), s < S, each row prefetched two rows ahead in its own stream. */
static inline void FN(dot_rows)(float *acc, const float *x, const WT *const *w, int K, const int S) {
    V a0 = VZERO(), a1 = VZERO();
    int k = 0;
    for (; k + VW <= K; k += VW) {
        const V xv = VLOAD(x + k);
        IG_PREFETCH_L1(w[0] + 2 * (size_t)K + k);
        a0 = VFMA(WLOAD(w[0] + k), xv, a0);
        if (S == 2) {
            IG_PREFETCH_L1(w[1] + 2 * (size_t)K + k);
            a1 = VFMA(WLOAD(w[1] + k), xv, a1);
        }
    }
    if (k < K) {
        const int n = K - k;
        const V xv = VLOADN(x + k, n);
        a0 = VFMA(WLOADN(w[0] + k, n), xv, a0);
        if (S == 2) a1 = VFMA(WLOADN(w[1] + k, n), xv, a1);
    }
    acc[0] = VSUM(a0);
    if (S == 2) acc[1] = VSUM(a1);
}

/* One activation row, IG_DECODE_STREAMS streams: index b of the parallel loop is block b, and with
 * two streams also block b + half, whose rows pair with block b's in order (a row without a partner
 * is a tile alone). */
static void FN(dec_rows)(const ig_matmul_args *a, int n_blocks) {
    const int N = a->N, K = a->K, S = IG_DECODE_STREAMS;
    const WT *W = a->w, *W2 = a->w2;
    const int half = (n_blocks + S - 1) / S;
    IG_FOR(b, half) {
        const int a0 = b * IG_NB, a1 = a0 + IG_NB < N ? a0 + IG_NB : N;
        const int z0 = (b + half) * IG_NB, z1 = S == 1 || z0 >= N ? z0 : z0 + IG_NB < N ? z0 + IG_NB : N;
        for (int j = 0; j < IG_NB && (a0 + j < a1 || z0 + j < z1); j++) {
            int n[2], two = 0;
            if (a0 + j < a1) n[two++] = a0 + j;
            if (z0 + j < z1) n[two++] = z0 + j;
            float g[2], u[2];
            const WT *ws[2] = {W + (size_t)n[0] * K, W + (size_t)n[two - 1] * K};
            if (two == 2) FN(dot_rows)(g, a->x, ws, K, 2);
            else FN(dot_rows)(g, a->x, ws, K, 1);
            if (W2) {
                const WT *ws2[2] = {W2 + (size_t)n[0] * K, W2 + (size_t)n[two - 1] * K};
                if (two == 2) FN(dot_rows)(u, a->x, ws2, K, 2);
                else FN(dot_rows)(u, a->x, ws2, K, 1);
            }
            for (int s = 0; s < two; s++)
                a->out[n[s]] = IG_MATMUL_EPILOGUE(a, g[s], W2 ? u[s] : 0.0f, 0, n[s]);
        }
    }
}
#endif

/* acc[i*4 + j] = dot(x[i], w[j]) */
static inline void FN(tile_4x4)(float *acc, const float *const *x, const WT *const *w, int K) {
    V c00 = VZERO(), c01 = VZERO(), c02 = VZERO(), c03 = VZERO();
    V c10 = VZERO(), c11 = VZERO(), c12 = VZERO(), c13 = VZERO();
    V c20 = VZERO(), c21 = VZERO(), c22 = VZERO(), c23 = VZERO();
    V c30 = VZERO(), c31 = VZERO(), c32 = VZERO(), c33 = VZERO();
    int k = 0;
#define IG_TILE_STEP(LOAD, WLD, ...)                                                      \
    {                                                                                     \
        const V w0 = WLD(w[0] + k, ##__VA_ARGS__), w1 = WLD(w[1] + k, ##__VA_ARGS__);     \
        const V w2 = WLD(w[2] + k, ##__VA_ARGS__), w3 = WLD(w[3] + k, ##__VA_ARGS__);     \
        V xv = LOAD(x[0] + k, ##__VA_ARGS__);                                             \
        c00 = VFMA(w0, xv, c00); c01 = VFMA(w1, xv, c01);                                 \
        c02 = VFMA(w2, xv, c02); c03 = VFMA(w3, xv, c03);                                 \
        xv = LOAD(x[1] + k, ##__VA_ARGS__);                                               \
        c10 = VFMA(w0, xv, c10); c11 = VFMA(w1, xv, c11);                                 \
        c12 = VFMA(w2, xv, c12); c13 = VFMA(w3, xv, c13);                                 \
        xv = LOAD(x[2] + k, ##__VA_ARGS__);                                               \
        c20 = VFMA(w0, xv, c20); c21 = VFMA(w1, xv, c21);                                 \
        c22 = VFMA(w2, xv, c22); c23 = VFMA(w3, xv, c23);                                 \
        xv = LOAD(x[3] + k, ##__VA_ARGS__);                                               \
        c30 = VFMA(w0, xv, c30); c31 = VFMA(w1, xv, c31);                                 \
        c32 = VFMA(w2, xv, c32); c33 = VFMA(w3, xv, c33);                                 \
    }
    for (; k + VW <= K; k += VW) IG_TILE_STEP(VLOAD, WLOAD)
    if (k < K) {
        const int n = K - k;
        IG_TILE_STEP(VLOADN, WLOADN, n)
    }
#undef IG_TILE_STEP
    acc[0] = VSUM(c00);  acc[1] = VSUM(c01);  acc[2] = VSUM(c02);  acc[3] = VSUM(c03);
    acc[4] = VSUM(c10);  acc[5] = VSUM(c11);  acc[6] = VSUM(c12);  acc[7] = VSUM(c13);
    acc[8] = VSUM(c20);  acc[9] = VSUM(c21);  acc[10] = VSUM(c22); acc[11] = VSUM(c23);
    acc[12] = VSUM(c30); acc[13] = VSUM(c31); acc[14] = VSUM(c32); acc[15] = VSUM(c33);
}

void FN(ig_matmul)(const ig_matmul_args *a, int n_threads) {
    const int T = a->T, N = a->N, K = a->K;
    const float *X = a->x;
    const WT *W = a->w, *W2 = a->w2;
    const int n_blocks = (N + IG_NB - 1) / IG_NB;
#ifdef IG_DECODE_STREAMS
    if (T == 1) {
        FN(dec_rows)(a, n_blocks);
        return;
    }
#endif
    IG_FOR(b, n_blocks) {
        const int n0 = b * IG_NB, n1 = n0 + IG_NB < N ? n0 + IG_NB : N;
        float g[16], u[16];
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *xs[4];
            for (int i = 0; i < 4; i++) xs[i] = X + (size_t)(t + i) * a->ldx;
            for (int n = n0; n < n1; n += 4) {
                const int nt = n1 - n < 4 ? n1 - n : 4;
                /* past the block's end, repeat its last row: valid memory, results discarded */
                const WT *ws[4], *ws2[4];
                for (int j = 0; j < 4; j++) {
                    const int r = j < nt ? n + j : n1 - 1;
                    ws[j] = W + (size_t)r * K;
                    ws2[j] = W2 ? W2 + (size_t)r * K : NULL;
                }
                FN(tile_4x4)(g, xs, ws, K);
                if (a->w2) FN(tile_4x4)(u, xs, ws2, K);
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < nt; j++)
                        a->out[(size_t)(t + i) * a->ldo + n + j] =
                            IG_MATMUL_EPILOGUE(a, g[i * 4 + j], a->w2 ? u[i * 4 + j] : 0.0f, t + i,
                                               n + j);
            }
        }
        for (; t < T; t++) {
            const float *x = X + (size_t)t * a->ldx;
            for (int n = n0; n < n1; n += 8) {
                const int nt = n1 - n < 8 ? n1 - n : 8;
                const WT *ws[8], *ws2[8];
                for (int j = 0; j < 8; j++) {
                    const int r = j < nt ? n + j : n1 - 1;
                    ws[j] = W + (size_t)r * K;
                    ws2[j] = W2 ? W2 + (size_t)r * K : NULL;
                }
                FN(tile_1x8)(g, x, ws, K);
                if (a->w2) FN(tile_1x8)(u, x, ws2, K);
                for (int j = 0; j < nt; j++)
                    a->out[(size_t)t * a->ldo + n + j] =
                        IG_MATMUL_EPILOGUE(a, g[j], a->w2 ? u[j] : 0.0f, t, n + j);
            }
        }
    }
    (void)n_threads;
}

#undef IG_NB
#undef IG_DECODE_STREAMS
#undef WT
#undef WLOAD
#undef WLOADN
