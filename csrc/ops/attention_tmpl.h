/* attention_tmpl.h — causal GQA attention over the KV cache (see ig_attention_f32_ref in
 * ignis.h), written once in portable C and compiled per ISA: ops/nn.c includes it for the portable
 * twin, the arch files with their own flags, where the compiler vectorizes the head_dim loops. The
 * includer defines ATTN(name) (adds its suffix). Every row and head is summed in one fixed order.
 * Two paths: the tiled one (head_dim <= 256: tiles of query rows x heads against blocks of 16
 * keys, an online softmax; see below) and the untiled one (larger heads: one row of one head at a
 * time, all its scores then their softmax).
 *
 * The key cache is kept in blocks of IG_KV_BLOCK positions stored transposed (ig_kcache_at in
 * ignis.h: one KV head's part of a block is head_dim x 16, position fastest); values row-major.
 *
 * An ISA may replace parts with intrinsics (csrc/arch/ only): defining IG_ATTN_TILE_FAST, it
 * provides the tiled path's ATTN(tile_block16) and ATTN(tile_pv16) (head_dim 64, 128, 256), and
 * defining IG_ATTN_TILE_FEW the decode shape's ATTN(few_*) (keys as vector lanes: AVX-512's with
 * its own online softmax step, IG_ATTN_FEW_STEP, AVX2's too); for the
 * untiled path, defining IG_ATTN_EXP_SUM, ATTN(exp_sum) (see csrc/arch/attention_avx512.h);
 * defining IG_ATTN_F16_ROW, ATTN(f16_row): f16 cache elements widened by the CPU's conversion
 * instruction (exact, as ig_f16_to_f32 is: the same floats).
 */
#include "attention_tile.h"

/* q.k with eight partial sums in a fixed order: the compiler keeps them in vector registers (a
 * single running sum would be a serial chain), and the order never depends on threads */
static inline float ATTN(dot_8way)(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

#ifndef IG_ATTN_F16_ROW
static inline void ATTN(f16_row)(float *buf, const uint16_t *h, int n) {
    for (int i = 0; i < n; i++) buf[i] = ig_f16_to_f32(h[i]);
}
#endif

/* a cache row as f32: in place for f32 storage, widened into buf for f16 */
static inline const float *ATTN(kv_row)(const void *cache, int kv_f16, size_t offset, int n, float *buf) {
    if (!kv_f16) return (const float *)cache + offset;
    ATTN(f16_row)(buf, (const uint16_t *)cache + offset, n);
    return buf;
}

/* sc[j] = exp(sc[j] - m) for j < n; returns their sum: ig_expf_f32 (glibc's expf, bit for bit, on
 * every platform) and a running sum, in index order */
#ifndef IG_ATTN_EXP_SUM
static inline float ATTN(exp_sum)(float *sc, int n, float m) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        sc[j] = ig_expf_f32(sc[j] - m);
        sum += sc[j];
    }
    return sum;
}
#endif

/* key row r of a slot (its elements at `at`, IG_KV_BLOCK apart: ig_kcache_at) as f32 in buf */
static inline const float *ATTN(k_row)(float *buf, const void *cache, int kv_f16, size_t at, int n) {
    for (int i = 0; i < n; i++)
        buf[i] = kv_f16 ? ig_f16_to_f32(((const uint16_t *)cache)[at + (size_t)i * IG_KV_BLOCK])
                        : ((const float *)cache)[at + (size_t)i * IG_KV_BLOCK];
    return buf;
}

/* o (+)= sum_j p[j] * v_j over n consecutive cache rows at base; acc: add to o, else overwrite */
static inline void ATTN(weighted)(float *restrict o, const float *p, const void *v_cache, int kv_f16,
                                  size_t base, int kv_dim, int n, int head_dim, int acc, float *buf) {
    if (!acc)
        for (int i = 0; i < head_dim; i++) o[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float pj = p[j];
        const float *restrict vr = ATTN(kv_row)(v_cache, kv_f16, base + (size_t)j * kv_dim, head_dim, buf);
        for (int i = 0; i < head_dim; i++) o[i] += pj * vr[i];
    }
}

/* ---- the untiled path (head_dim > IG_ATTN_TILE_MAX_HD): one query row of one head at a time,
 * all its scores, then their softmax and the weighted sum of values ---- */
static void ATTN(attention_rows)(float *out, int64_t ldo, const float *q, int64_t ldq,
                                 const void *k_cache, const void *v_cache, int kv_f16,
                                 const int32_t *pos, const int32_t *seq, float *scratch, int T,
                                 int n_heads, int n_kv_heads, int head_dim, int max_ctx, int kv_rows,
                                 float scale, int window) {
    const int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
    IG_FOR(h, n_heads) {
        float *sc = scratch + (size_t)h * max_ctx;     /* this head's score row: no [T, T] buffer */
        float buf[IG_MAX_HEAD_DIM];
        const size_t head_off = (size_t)(h / group) * head_dim;
        for (int t = 0; t < T; t++) {
            const float *qr = q + (size_t)t * ldq + (size_t)h * head_dim;
            float *restrict o = out + (size_t)t * ldo + (size_t)h * head_dim;
            /* the keys first..pos[t], key j at cache row j % kv_rows: one run of rows, or two when
             * they wrap around a ring (sc[0..n1) then sc[n1..n)) */
            const int first = window > 0 && pos[t] >= window ? pos[t] - window + 1 : 0;
            const int n = pos[t] + 1 - first, r0 = first % kv_rows;
            const int n1 = n < kv_rows - r0 ? n : kv_rows - r0;
            const int s = seq ? seq[t] : 0;
            const size_t slot = (size_t)s * (size_t)kv_rows * kv_dim + head_off;
            const size_t base = slot + (size_t)r0 * kv_dim;
            float m = -INFINITY;
            for (int j = 0, r = r0; j < n; j++, r = r + 1 == kv_rows ? 0 : r + 1) {
                const float *kr = ATTN(k_row)(buf, k_cache, kv_f16,
                                              ig_kcache_at(s, r, (int64_t)head_off, kv_rows, kv_dim), head_dim);
                sc[j] = ATTN(dot_8way)(qr, kr, head_dim) * scale;
                if (sc[j] > m) m = sc[j];
            }
            /* softmax with the row maximum subtracted: exp never overflows */
            const float sum = ATTN(exp_sum)(sc, n, m);
            ATTN(weighted)(o, sc, v_cache, kv_f16, base, kv_dim, n1, head_dim, 0, buf);
            if (n > n1)
                ATTN(weighted)(o, sc + n1, v_cache, kv_f16, slot, kv_dim, n - n1, head_dim, 1, buf);
            const float inv = 1.0f / sum;
            for (int i = 0; i < head_dim; i++) o[i] *= inv;
        }
    }
}

/* ---- the tiled path (flash-attention style): a unit of work is a tile of query rows of one
 * sequence times some query heads of one KV head, its "lanes" (row-major: lane = row * heads +
 * head). The keys are visited in blocks of IG_ATTN_KB at absolute positions (16b .. 16b+15),
 * each block's keys (one block of the key cache: (head_dim, 16), read in place from an f32
 * cache, widened once from f16) and its V rows (copied once, unwrapped from a ring) read by every
 * lane of the tile; each lane keeps a running maximum m, a running sum l and its output
 * row o, rescaled by exp(m_old - m_new) when the maximum grows (an online softmax).
 *
 * What a lane computes depends on its query, its keys and nothing else: its score for key j is
 * one chain of multiply-adds over d = 0..head_dim-1 (fma in AVX-512's block; a product then a
 * sum here, the sources being ISO C, uncontracted, and so in AVX2's decode shape), its block
 * steps are at fixed positions, a key outside its window weighs exactly 0 and a scale by exactly
 * 1 changes no bit. So a row has the same bits in a tile of 1 (decode) or of many, whatever the
 * chunk, the thread count or the head split, and the same over a ring as over a full cache.
 *
 * The per-block parts, portable here; an ISA defining IG_ATTN_TILE_FAST provides
 * ATTN(tile_block16) and ATTN(tile_pv16) for head_dim 64, 128 and 256 (arch/attention_avx512.h). */
#define IG_ATTN_KB IG_KV_BLOCK     /* keys per online-softmax step: one block of the key cache */
#define IG_ATTN_MAX_LANES 128      /* lanes of a unit: (rows x heads), at most */
#define IG_ATTN_QO_FLOATS 16384    /* its queries and outputs: 2 x head_dim x lanes, at most */

/* scores of 16 lanes (at lane l0) against the block's 16 keys (kb: (head_dim, 16)), their online
 * softmax step: m, l, al updated, the weights into p */
static inline void ATTN(tile_block_ref)(ig_attn_tile *tl, int l0, const float *kb, int k0,
                                        float scale) {
    const int hd = tl->head_dim, nlp = tl->nlp;
    float s[IG_ATTN_KB][16];
    /* 4 keys at a time: their 64 sums fit the vector registers of AVX2 or NEON (the order of
     * each sum is the same either way) */
    for (int j0 = 0; j0 < IG_ATTN_KB; j0 += 4) {
        float acc[4][16] = {{0}};
        for (int d = 0; d < hd; d++) {
            const float *qd = tl->qt + (size_t)d * nlp + l0;
            for (int j = 0; j < 4; j++) {
                const float kd = kb[(size_t)d * IG_ATTN_KB + j0 + j];
                for (int x = 0; x < 16; x++) acc[j][x] += kd * qd[x];
            }
        }
        memcpy(s[j0], acc, sizeof acc);
    }
    for (int x = 0; x < 16; x++) {
        const int l = l0 + x, a = tl->lf[l] - k0, b = tl->lp[l] - k0;
        const float mo = tl->m[l];
        float mx = mo;
        for (int j = 0; j < IG_ATTN_KB; j++) {
            s[j][x] *= scale;
            if (j >= a && j <= b && s[j][x] > mx) mx = s[j][x];
        }
        const float alpha = mo == -INFINITY ? 0.0f : ig_expf_f32(mo - mx);
        float sum = tl->l[l] * alpha;
        for (int j = 0; j < IG_ATTN_KB; j++) {
            const float pj = j >= a && j <= b ? ig_expf_f32(s[j][x] - mx) : 0.0f;
            tl->p[(size_t)j * nlp + l] = pj;
            sum += pj;
        }
        tl->m[l] = mx;
        tl->l[l] = sum;
        tl->al[l] = alpha;
    }
}

/* o = o * al + sum_j p[j] v_j for every lane, the block's values vb: (16, head_dim) */
static inline void ATTN(tile_pv_ref)(ig_attn_tile *tl, const float *vb, int nl) {
    const int hd = tl->head_dim, nlp = tl->nlp;
    for (int l = 0; l < nl; l++) {
        float *restrict o = tl->o + (size_t)l * hd;
        const float a = tl->al[l];
        for (int i = 0; i < hd; i++) o[i] *= a;
        for (int j = 0; j < IG_ATTN_KB; j++) {
            const float pj = tl->p[(size_t)j * nlp + l];
            const float *restrict vr = vb + (size_t)j * hd;
            for (int i = 0; i < hd; i++) o[i] += pj * vr[i];
        }
    }
}

/* The block's cache rows as f32 rows (16, head_dim): row j from element at[j] of the cache
 * (widened from f16), or zero where at[j] < 0 (a position no lane of the tile reads). */
static inline void ATTN(tile_rows)(float *dst, const void *cache, int kv_f16, const int64_t *at,
                                   int head_dim) {
    for (int j = 0; j < IG_ATTN_KB; j++) {
        float *row = dst + (size_t)j * head_dim;
        if (at[j] < 0) {
            for (int i = 0; i < head_dim; i++) row[i] = 0.0f;
        } else if (kv_f16) {
            ATTN(f16_row)(row, (const uint16_t *)cache + at[j], head_dim);
        } else {
            memcpy(row, (const float *)cache + at[j], (size_t)head_dim * sizeof(float));
        }
    }
}

/* bring those rows towards the core while the block before them is computed (one KV head's
 * part of each position: strided rows) */
#if defined(__GNUC__) || defined(__clang__)
#  define IG_ATTN_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#  define IG_ATTN_PREFETCH(p) ((void)(p))
#endif
static inline void ATTN(tile_prefetch)(const void *cache, int kv_f16, const int64_t *at,
                                       int head_dim) {
    const size_t esize = kv_f16 ? 2 : 4, bytes = (size_t)head_dim * esize;
    for (int j = 0; j < IG_ATTN_KB; j++)
        if (at[j] >= 0)
            for (size_t b = 0; b < bytes; b += 64)
                IG_ATTN_PREFETCH((const char *)cache + (size_t)at[j] * esize + b);
}

/* where the keys k0..k0+15 are: element at[j] of the cache for the positions lo..hi (ring row
 * p % kv_rows), -1 for the others */
static inline void ATTN(tile_where)(int64_t *at, size_t slot, int kv_dim, int kv_rows, int k0,
                                    int lo, int hi) {
    int r = k0 % kv_rows;
    for (int j = 0; j < IG_ATTN_KB; j++, r = r + 1 == kv_rows ? 0 : r + 1)
        at[j] = k0 + j < lo || k0 + j > hi ? -1 : (int64_t)(slot + (size_t)r * kv_dim);
}

/* element offset of the key block at positions k0..k0+15 (k0 a multiple of 16) of slot s, KV head
 * columns from hoff: (head_dim, 16) contiguous elements */
static inline size_t ATTN(tile_kat)(int s, int hoff, int kv_dim, int kv_rows, int k0) {
    return ig_kcache_at(s, k0 % kv_rows, hoff, kv_rows, kv_dim);
}

/* that key block as f32: in place from an f32 cache, widened into kb from f16 */
static inline const float *ATTN(tile_keys)(float *kb, const void *cache, int kv_f16, size_t at,
                                           int head_dim) {
    if (!kv_f16) return (const float *)cache + at;
    ATTN(f16_row)(kb, (const uint16_t *)cache + at, IG_ATTN_KB * head_dim);
    return kb;
}

static inline void ATTN(tile_prefetch_keys)(const void *cache, int kv_f16, size_t at, int head_dim) {
    const size_t esize = kv_f16 ? 2 : 4, bytes = (size_t)IG_ATTN_KB * head_dim * esize;
    for (size_t b = 0; b < bytes; b += 64) IG_ATTN_PREFETCH((const char *)cache + at * esize + b);
}

#ifdef IG_ATTN_TILE_FEW
/* the online softmax step of the lanes r < ATTN(few_lanes) for the block at k0, their scaled
 * scores s (R, 16): ATTN(tile_block_ref)'s, lane by lane. An ISA that defines IG_ATTN_FEW_STEP
 * brings its own ATTN(few_step): in vectors with these bits (AVX2, which may call this one for
 * few lanes), or with the exp of its own tiled block (AVX-512). */
static inline void ATTN(few_step_ref)(ig_attn_tile *tl, int nl, const float *s, int k0) {
    const int R = ATTN(few_lanes)(nl, tl->head_dim), nlp = tl->nlp;
    for (int r = 0; r < R; r++) {
        const float *sr = s + (size_t)r * IG_ATTN_KB;
        const int a = tl->lf[r] - k0, b = tl->lp[r] - k0;
        const float mo = tl->m[r];
        float mx = mo;
        for (int j = 0; j < IG_ATTN_KB; j++)
            if (j >= a && j <= b && sr[j] > mx) mx = sr[j];
        const float alpha = mo == -INFINITY ? 0.0f : ig_expf_f32(mo - mx);
        float sum = tl->l[r] * alpha;
        for (int j = 0; j < IG_ATTN_KB; j++) {
            const float pj = j >= a && j <= b ? ig_expf_f32(sr[j] - mx) : 0.0f;
            tl->p[(size_t)j * nlp + r] = pj;
            sum += pj;
        }
        tl->m[r] = mx;
        tl->l[r] = sum;
        tl->al[r] = alpha;
    }
}
#ifndef IG_ATTN_FEW_STEP
static inline void ATTN(few_step)(ig_attn_tile *tl, int nl, const float *s, int k0) {
    ATTN(few_step_ref)(tl, nl, s, k0);
}
#endif

/* a tile of few lanes (decode: the heads of one KV head, one row): the ISA's scores with keys as
 * vector lanes, read from the key blocks in place (no transpose: the cache holds them so),
 * ATTN(few_blocks) blocks at a time, the next pass's keys and value rows prefetched meanwhile
 * (ig_attn_ahead); then the blocks' online softmax steps and weighted sums in order, the same
 * arithmetic as the tiled block's, so the same bits */
static void ATTN(tile_few_run)(ig_attn_tile *tl, int nl, const void *k_cache, const void *v_cache,
                               int kv_f16, int s, int hoff, size_t vslot, int kv_dim, int kv_rows,
                               int lo, int hi, float scale, float *vb) {
    const int hd = tl->head_dim, nb = ATTN(few_blocks)(nl, hd), R = ATTN(few_lanes)(nl, hd);
    const int esize = kv_f16 ? 2 : 4;
    float sc[8 * IG_ATTN_KB];
    int64_t at[2][4][IG_ATTN_KB];   /* this pass's value rows, and the next pass's */
    size_t kat[4];
    ig_attn_ahead ah = {.v = (const char *)v_cache, .esize = esize, .row_bytes = hd * esize};
    const int first = lo / IG_ATTN_KB * IG_ATTN_KB;
    for (int b = 0; b < nb; b++)
        ATTN(tile_where)(at[0][b], vslot, kv_dim, kv_rows, first + b * IG_ATTN_KB, lo, hi);
    for (int k0 = first, cur = 0; k0 <= hi; k0 += nb * IG_ATTN_KB, cur ^= 1) {
        for (int b = 0; b < nb; b++) {
            const int kn = k0 + (nb + b) * IG_ATTN_KB;
            kat[b] = ATTN(tile_kat)(s, hoff, kv_dim, kv_rows, k0 + b * IG_ATTN_KB);
            ATTN(tile_where)(at[cur ^ 1][b], vslot, kv_dim, kv_rows, kn, lo, hi);
            ah.k[b] = kn <= hi ? (const char *)k_cache +
                                     ATTN(tile_kat)(s, hoff, kv_dim, kv_rows, kn) * (size_t)esize
                               : NULL;
            ah.vat[b] = at[cur ^ 1][b];
        }
        ATTN(few_scores)(sc, tl, k_cache, kv_f16, kat, nl, scale, &ah);
        for (int b = 0; b < nb && k0 + b * IG_ATTN_KB <= hi; b++) {
            const int kb0 = k0 + b * IG_ATTN_KB;
            ATTN(few_step)(tl, nl, sc + (size_t)b * R * IG_ATTN_KB, kb0);
            /* a block every position of which is read: its value rows in place; else copied,
             * the others zero (a weight 0 never meets a stale row) */
            if (kb0 >= lo && kb0 + IG_ATTN_KB - 1 <= hi) {
                ATTN(few_pv_cache)(tl, v_cache, kv_f16, at[cur][b], nl);
            } else {
                ATTN(tile_rows)(vb, v_cache, kv_f16, at[cur][b], hd);
#ifdef IG_ATTN_TILE_FAST
                ATTN(tile_pv16)(tl, vb, nl);
#else
                ATTN(tile_pv_ref)(tl, vb, nl);
#endif
            }
        }
    }
}
#endif

/* one run of rows t0..t1-1 (one sequence) x heads h0..h0+hn-1 (one KV head) */
static void ATTN(tile_run)(float *out, int64_t ldo, const float *q, int64_t ldq,
                           const void *k_cache, const void *v_cache, int kv_f16,
                           const int32_t *pos, const int32_t *seq, int t0, int t1, int h0, int hn,
                           int n_kv_heads, int head_dim, int kv_rows, float scale, int window,
                           int group, float *mem) {
    const int hd = head_dim, kv_dim = n_kv_heads * hd, nl = (t1 - t0) * hn, nlp = (nl + 15) & ~15;
    ig_attn_tile tl = {.nlp = nlp, .head_dim = hd};
    tl.qt = mem;
    tl.o = tl.qt + (size_t)hd * nlp;
    tl.m = tl.o + (size_t)nlp * hd;
    tl.l = tl.m + nlp;
    tl.al = tl.l + nlp;
    tl.p = tl.al + nlp;
    float *kbuf = tl.p + (size_t)IG_ATTN_KB * nlp, *vb = kbuf + (size_t)IG_ATTN_KB * hd;
    int32_t lf[IG_ATTN_MAX_LANES], lp[IG_ATTN_MAX_LANES];
    tl.lf = lf;
    tl.lp = lp;
    int lo = INT32_MAX, hi = -1;
    /* padding lanes: lane 0's keys and a zero query (their results are dropped) */
    memset(tl.qt, 0, sizeof(float) * (size_t)hd * nlp);
    memset(tl.o, 0, sizeof(float) * (size_t)nlp * hd);
    for (int l = 0; l < nlp; l++) {
        const int t = l < nl ? t0 + l / hn : t0, h = l < nl ? h0 + l % hn : h0;
        lp[l] = pos[t];
        lf[l] = window > 0 && pos[t] >= window ? pos[t] - window + 1 : 0;
        if (lf[l] < lo) lo = lf[l];
        if (lp[l] > hi) hi = lp[l];
        if (l < nl) {
            const float *qr = q + (size_t)t * ldq + (size_t)h * hd;
            for (int d = 0; d < hd; d++) tl.qt[(size_t)d * nlp + l] = qr[d];
        }
        tl.m[l] = -INFINITY;
        tl.l[l] = 0.0f;
    }
    const int s = seq ? seq[t0] : 0, hoff = h0 / group * hd;
    const size_t slot = (size_t)s * (size_t)kv_rows * kv_dim + (size_t)hoff;   /* of the V rows */
#if defined(IG_ATTN_TILE_FAST) || defined(IG_ATTN_TILE_FEW)
    const int fast = hd == 64 || hd == 128 || hd == 256;
#endif
#ifdef IG_ATTN_TILE_FEW
    if (fast && nl <= IG_ATTN_TILE_FEW) {
        ATTN(tile_few_run)(&tl, nl, k_cache, v_cache, kv_f16, s, hoff, slot, kv_dim, kv_rows, lo, hi,
                           scale, vb);
        hi = -1;    /* the blocks are done */
    }
#endif
    int64_t at[IG_ATTN_KB];
    ATTN(tile_where)(at, slot, kv_dim, kv_rows, lo / IG_ATTN_KB * IG_ATTN_KB, lo, hi);
    for (int k0 = lo / IG_ATTN_KB * IG_ATTN_KB; k0 <= hi; k0 += IG_ATTN_KB) {
        const float *kb = ATTN(tile_keys)(kbuf, k_cache, kv_f16,
                                          ATTN(tile_kat)(s, hoff, kv_dim, kv_rows, k0), hd);
        ATTN(tile_rows)(vb, v_cache, kv_f16, at, hd);
        ATTN(tile_where)(at, slot, kv_dim, kv_rows, k0 + IG_ATTN_KB, lo, hi);
        if (k0 + IG_ATTN_KB <= hi)
            ATTN(tile_prefetch_keys)(k_cache, kv_f16,
                                     ATTN(tile_kat)(s, hoff, kv_dim, kv_rows, k0 + IG_ATTN_KB), hd);
        ATTN(tile_prefetch)(v_cache, kv_f16, at, hd);
#ifdef IG_ATTN_TILE_FAST
        if (fast) {
            for (int l0 = 0; l0 < nlp; l0 += 16) ATTN(tile_block16)(&tl, l0, kb, k0, scale);
            ATTN(tile_pv16)(&tl, vb, nl);
            continue;
        }
#endif
        for (int l0 = 0; l0 < nlp; l0 += 16) ATTN(tile_block_ref)(&tl, l0, kb, k0, scale);
        ATTN(tile_pv_ref)(&tl, vb, nl);
    }
    for (int l = 0; l < nl; l++) {
        const int t = t0 + l / hn, h = h0 + l % hn;
        float *restrict o = out + (size_t)t * ldo + (size_t)h * hd;
        const float *restrict ol = tl.o + (size_t)l * hd;
        const float inv = 1.0f / tl.l[l];
        for (int i = 0; i < hd; i++) o[i] = ol[i] * inv;
    }
}

void ATTN(ig_attention_f32)(float *out, int64_t ldo, const float *q, int64_t ldq, const void *k_cache,
                          const void *v_cache, int kv_f16, const int32_t *pos, const int32_t *seq,
                          float *scratch, int T, int n_heads, int n_kv_heads, int head_dim,
                          int max_ctx, int kv_rows, float scale, int window, int n_threads) {
    if (head_dim > IG_ATTN_TILE_MAX_HD) {
        ATTN(attention_rows)(out, ldo, q, ldq, k_cache, v_cache, kv_f16, pos, seq, scratch, T,
                             n_heads, n_kv_heads, head_dim, max_ctx, kv_rows, scale, window);
        return;
    }
    const int group = n_heads / n_kv_heads;
    /* lanes per unit: the more, the fewer times a block is read; its queries and outputs (2 x
     * head_dim x lanes floats) stay within L2 */
    const int max_lanes = head_dim <= 64 ? 128 : head_dim <= 128 ? 64 : 32;
    /* heads per unit: the whole group (each block read once for all of them), split while there
     * are fewer units than threads (decode); the split changes no bit */
    int hs = group < max_lanes ? group : max_lanes;
    int rows = max_lanes / hs, nsub = (group + hs - 1) / hs, n_tiles = (T + rows - 1) / rows;
    while (hs > 1 && n_kv_heads * nsub * n_tiles < n_threads) {
        hs = (hs + 1) / 2;
        rows = max_lanes / hs;
        nsub = (group + hs - 1) / hs;
        n_tiles = (T + rows - 1) / rows;
    }
    /* queries and outputs, (16 + 3) x lanes, the block's rows 2 x 16 x head_dim: about 105 KiB,
     * this thread's scratch (not its stack: a caller's may have 128 KiB); without it this thread
     * takes no tiles and the job's others do them all (ig_call_attention makes the caller's) */
    _Static_assert(IG_ATTN_SCRATCH_BYTES >= sizeof(float) * (IG_ATTN_QO_FLOATS + (IG_ATTN_KB + 3) *
                   IG_ATTN_MAX_LANES + 2 * IG_ATTN_KB * IG_ATTN_TILE_MAX_HD), "IG_ATTN_SCRATCH_BYTES");
    float *mem = ig_thread_scratch(IG_ATTN_SCRATCH_BYTES);
    if (!mem) return;
    IG_FOR(u, n_kv_heads * nsub * n_tiles) {
        const int sub = u % nsub, kvh = u / nsub % n_kv_heads, tile = u / nsub / n_kv_heads;
        const int h0 = kvh * group + sub * hs, hn = group - sub * hs < hs ? group - sub * hs : hs;
        const int t_end = (tile + 1) * rows < T ? (tile + 1) * rows : T;
        /* runs of rows of one sequence (a batch may mix sequences) */
        for (int t0 = tile * rows, t1; t0 < t_end; t0 = t1) {
            for (t1 = t0 + 1; t1 < t_end && (seq ? seq[t1] == seq[t0] : 1); t1++) {}
            ATTN(tile_run)(out, ldo, q, ldq, k_cache, v_cache, kv_f16, pos, seq, t0, t1, h0, hn,
                           n_kv_heads, head_dim, kv_rows, scale, window, group, mem);
        }
    }
}

#undef IG_ATTN_TILE_FAST
#undef IG_ATTN_TILE_FEW
#undef IG_ATTN_FEW_STEP
#undef IG_ATTN_KB
#undef IG_ATTN_TILE_MAX_HD
#undef IG_ATTN_MAX_LANES
#undef IG_ATTN_QO_FLOATS
#undef IG_ATTN_PREFETCH
#undef IG_ATTN_EXP_SUM
