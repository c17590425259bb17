/* attention_tmpl.h — causal GQA attention over the KV cache (see ig_attention_f32_ref in
 * ignis.h), written once in portable C and compiled per ISA: ops/nn.c includes it for the portable
 * twin, the arch files with their own flags, where the compiler vectorizes the head_dim loops. The
 * includer defines ATTN(name) (adds its suffix). Every row and head is summed in one fixed order.
 *
 * An ISA may replace parts with intrinsics (csrc/arch/ only): defining IG_ATTN_EXP_SUM before
 * including this, it provides ATTN(exp_sum); defining IG_ATTN_FAST, it provides ATTN(scores16)
 * and ATTN(weighted16) for head_dim 64, 128 or 256, f32 or f16 cache (see csrc/arch/attention_avx512.h);
 * defining IG_ATTN_F16_ROW, ATTN(f16_row): an f16 cache row widened by the CPU's conversion
 * instruction (exact, as ig_f16_to_f32 is: the same floats).
 */

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

/* sc[j] = exp(sc[j] - m) for j < n; returns their sum: libm's expf and a running sum, in index
 * order */
#ifndef IG_ATTN_EXP_SUM
static inline float ATTN(exp_sum)(float *sc, int n, float m) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        sc[j] = expf(sc[j] - m);
        sum += sc[j];
    }
    return sum;
}
#endif

/* The scores sc[0..n) of q against n consecutive cache rows at kb (f32 or f16); returns their
 * maximum, m_in included. */
static inline float ATTN(scores)(float *sc, const float *qr, const void *k_cache, int kv_f16,
                                 size_t base, int kv_dim, int n, int head_dim, float scale,
                                 float m, float *buf) {
    int j0 = 0;
#ifdef IG_ATTN_FAST
    /* head_dim 64, 128 or 256: 16 keys' dot products at a time (each C, F16 a compiled variant) */
    if (head_dim == 64 || head_dim == 128 || head_dim == 256) {
        j0 = n / 16 * 16;
        if (j0) {
            const int C = head_dim / 16;
#define IG_SCORES16(CC) (kv_f16 ? ATTN(scores16)(sc, qr, k_cache, base, kv_dim, j0, scale, CC, 1) \
                                : ATTN(scores16)(sc, qr, k_cache, base, kv_dim, j0, scale, CC, 0))
            const float m16 = C == 4 ? IG_SCORES16(4) : C == 8 ? IG_SCORES16(8) : IG_SCORES16(16);
#undef IG_SCORES16
            if (m16 > m) m = m16;
        }
    }
#endif
    for (int j = j0; j < n; j++) {
        const float *kr = ATTN(kv_row)(k_cache, kv_f16, base + (size_t)j * kv_dim, head_dim, buf);
        const float d = ATTN(dot_8way)(qr, kr, head_dim) * scale;
        sc[j] = d;
        if (d > m) m = d;
    }
    return m;
}

/* o (+)= sum_j p[j] * v_j over n consecutive cache rows at base; acc: add to o, else overwrite */
static inline void ATTN(weighted)(float *restrict o, const float *p, const void *v_cache, int kv_f16,
                                  size_t base, int kv_dim, int n, int head_dim, int acc, float *buf) {
#ifdef IG_ATTN_FAST
    if (head_dim == 64 || head_dim == 128 || head_dim == 256) {
#define IG_WEIGHTED16(CC) (kv_f16 ? ATTN(weighted16)(o, p, v_cache, base, kv_dim, n, acc, CC, 1) \
                                  : ATTN(weighted16)(o, p, v_cache, base, kv_dim, n, acc, CC, 0))
        if (head_dim == 64) IG_WEIGHTED16(4);
        else if (head_dim == 128) IG_WEIGHTED16(8);
        else IG_WEIGHTED16(16);
#undef IG_WEIGHTED16
        return;
    }
#endif
    if (!acc)
        for (int i = 0; i < head_dim; i++) o[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float pj = p[j];
        const float *restrict vr = ATTN(kv_row)(v_cache, kv_f16, base + (size_t)j * kv_dim, head_dim, buf);
        for (int i = 0; i < head_dim; i++) o[i] += pj * vr[i];
    }
}

void ATTN(ig_attention_f32)(float *out, int64_t ldo, const float *q, int64_t ldq, const void *k_cache,
                          const void *v_cache, int kv_f16, const int32_t *pos, const int32_t *seq,
                          float *scratch, int T, int n_heads, int n_kv_heads, int head_dim,
                          int max_ctx, int kv_rows, float scale, int window, int n_threads) {
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
            const size_t slot = (size_t)(seq ? seq[t] : 0) * (size_t)kv_rows * kv_dim + head_off;
            const size_t base = slot + (size_t)r0 * kv_dim;
            float m = ATTN(scores)(sc, qr, k_cache, kv_f16, base, kv_dim, n1, head_dim, scale,
                                   -INFINITY, buf);
            if (n > n1)
                m = ATTN(scores)(sc + n1, qr, k_cache, kv_f16, slot, kv_dim, n - n1, head_dim, scale,
                                 m, buf);
            /* softmax with the row maximum subtracted: exp never overflows */
            const float sum = ATTN(exp_sum)(sc, n, m);
            ATTN(weighted)(o, sc, v_cache, kv_f16, base, kv_dim, n1, head_dim, 0, buf);
            if (n > n1)
                ATTN(weighted)(o, sc + n1, v_cache, kv_f16, slot, kv_dim, n - n1, head_dim, 1, buf);
            const float inv = 1.0f / sum;
            for (int i = 0; i < head_dim; i++) o[i] *= inv;
        }
    }
    (void)n_threads;
}

#undef IG_ATTN_FAST
#undef IG_ATTN_EXP_SUM
