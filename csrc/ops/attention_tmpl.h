/* attention_tmpl.h — causal GQA attention over the KV cache (see ig_attention_f32_ref in
 * ignis.h), written once in portable C and compiled per ISA: ops/nn.c includes it for the portable
 * twin, the arch files with their own flags, where the compiler vectorizes the head_dim loops. The
 * includer defines ATTN(name) (adds its suffix). Every row and head is summed in one fixed order.
 *
 * An ISA may replace parts with intrinsics (csrc/arch/ only): defining IG_ATTN_EXP_SUM before
 * including this, it provides ATTN(exp_sum); defining IG_ATTN_FAST, it provides ATTN(scores16)
 * and ATTN(weighted16) for an f32 cache with head_dim 64 or 128 (see csrc/arch/attention_avx512.h).
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

/* a cache row as f32: in place for f32 storage, widened into buf for f16 */
static inline const float *ATTN(kv_row)(const void *cache, int kv_f16, size_t offset, int n, float *buf) {
    if (!kv_f16) return (const float *)cache + offset;
    const uint16_t *h = (const uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) buf[i] = ig_f16_to_f32(h[i]);
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

void ATTN(ig_attention_f32)(float *out, int64_t ldo, const float *q, int64_t ldq, const void *k_cache,
                          const void *v_cache, int kv_f16, const int32_t *pos, const int32_t *seq,
                          float *scratch, int T, int n_heads, int n_kv_heads, int head_dim,
                          int max_ctx, float scale, int window, int n_threads) {
    const int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads > 0 ? n_threads : 1)
#endif
    for (int h = 0; h < n_heads; h++) {
        float *sc = scratch + (size_t)h * max_ctx;     /* this head's score row: no [T, T] buffer */
        float buf[IG_MAX_HEAD_DIM];
        const size_t head_off = (size_t)(h / group) * head_dim;
        for (int t = 0; t < T; t++) {
            const float *qr = q + (size_t)t * ldq + (size_t)h * head_dim;
            float *restrict o = out + (size_t)t * ldo + (size_t)h * head_dim;
            /* the keys first..pos[t]: sc[j] and the rows at base + j*kv_dim are key first + j */
            const int first = window > 0 && pos[t] >= window ? pos[t] - window + 1 : 0;
            const int n = pos[t] + 1 - first;
            const size_t base = ((size_t)(seq ? seq[t] : 0) * (size_t)max_ctx + (size_t)first) * kv_dim
                                + head_off;
            float m = -INFINITY;
            int j0 = 0;
#ifdef IG_ATTN_FAST
            /* f32 cache, head_dim 64 or 128: 16 keys' dot products at a time */
            const int fast = !kv_f16 && (head_dim == 64 || head_dim == 128);
            if (fast) {
                const float *kb = (const float *)k_cache + base;
                j0 = n / 16 * 16;
                if (j0) m = head_dim == 64 ? ATTN(scores16)(sc, qr, kb, kv_dim, j0, scale, 4)
                                           : ATTN(scores16)(sc, qr, kb, kv_dim, j0, scale, 8);
            }
#endif
            for (int j = j0; j < n; j++) {
                const float *kr = ATTN(kv_row)(k_cache, kv_f16, base + (size_t)j * kv_dim, head_dim, buf);
                const float d = ATTN(dot_8way)(qr, kr, head_dim) * scale;
                sc[j] = d;
                if (d > m) m = d;
            }
            /* softmax with the row maximum subtracted: exp never overflows */
            const float sum = ATTN(exp_sum)(sc, n, m);
#ifdef IG_ATTN_FAST
            if (fast) {
                const float *vb = (const float *)v_cache + base;
                if (head_dim == 64) ATTN(weighted16)(o, sc, vb, kv_dim, n, 4);
                else ATTN(weighted16)(o, sc, vb, kv_dim, n, 8);
            } else
#endif
            {
                for (int i = 0; i < head_dim; i++) o[i] = 0.0f;
                for (int j = 0; j < n; j++) {
                    const float p = sc[j];
                    const float *restrict vr = ATTN(kv_row)(v_cache, kv_f16, base + (size_t)j * kv_dim,
                                                            head_dim, buf);
                    for (int i = 0; i < head_dim; i++) o[i] += p * vr[i];
                }
            }
            const float inv = 1.0f / sum;
            for (int i = 0; i < head_dim; i++) o[i] *= inv;
        }
    }
    (void)n_threads;
}

#undef IG_ATTN_FAST
#undef IG_ATTN_EXP_SUM
