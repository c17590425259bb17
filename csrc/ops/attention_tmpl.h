/* attention_tmpl.h — causal GQA attention over the KV cache (see ig_attention_f32_ref in
 * ignis.h), written once and compiled per ISA: ops/nn.c includes it for the portable twin, the
 * arch files with their own flags, where the compiler vectorizes the head_dim loops. The includer
 * defines ATTN(name) (adds its suffix). Every row and head is summed in one fixed order.
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

/* sc[j] = exp(sc[j] - m) for j < n; returns their sum. With AVX-512 16 at a time: Cephes' expf
 * reduction and polynomial (|error| about 1 ulp), 2^k by vscalefps, a vector sum reduced once;
 * elsewhere libm's expf and a running sum. Either way one fixed order per build. */
#if defined(__AVX512F__)
static inline __m512 ATTN(exp16)(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, k);
}

static inline float ATTN(exp_sum)(float *sc, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 e = ATTN(exp16)(_mm512_sub_ps(_mm512_loadu_ps(sc + j), vm));
        _mm512_storeu_ps(sc + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
        const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
        const __m512 e = ATTN(exp16)(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + j), vm));
        _mm512_mask_storeu_ps(sc + j, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(acc);
}

/* The sums of 16 vectors' lanes, as one vector: r[i] = sum(a[i]). A fixed tree of in-lane
 * unpacks, shuffles and cross-lane permutes (45 instructions for 16 dot products, instead of a
 * full horizontal sum each). */
static inline __m512 ATTN(sum16)(const __m512 a[16]) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                                    _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88),
                                    _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

/* sc[j] = scale * q.k_j for the keys j < n16 (a multiple of 16) of an f32 cache, 16 keys at a time;
 * returns their maximum. C = head_dim / 16 vectors per row. */
static inline __attribute__((always_inline)) float ATTN(scores16)(
        float *sc, const float *qr, const float *k, size_t kv_dim, int n16, float scale, const int C) {
    __m512 q[8], vmax = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < C; c++) q[c] = _mm512_loadu_ps(qr + 16 * c);
    for (int j = 0; j < n16; j += 16) {
        __m512 a[16];
        for (int r = 0; r < 16; r++) {
            const float *kr = k + (size_t)(j + r) * kv_dim;
            __m512 acc = _mm512_mul_ps(q[0], _mm512_loadu_ps(kr));
            for (int c = 1; c < C; c++) acc = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kr + 16 * c), acc);
            a[r] = acc;
        }
        const __m512 s = _mm512_mul_ps(ATTN(sum16)(a), _mm512_set1_ps(scale));
        _mm512_storeu_ps(sc + j, s);
        vmax = _mm512_max_ps(vmax, s);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* o = sum_j p[j] * v_j over j < n, o kept in C registers */
static inline __attribute__((always_inline)) void ATTN(weighted16)(
        float *o, const float *p, const float *v, size_t kv_dim, int n, const int C) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        const float *vr = v + (size_t)j * kv_dim;
        for (int c = 0; c < C; c++) acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * c), acc[c]);
    }
    for (int c = 0; c < C; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}

#define IG_ATTN_FAST 1
#else
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
                          int max_ctx, int n_threads) {
    const int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
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
            const int n = pos[t] + 1;
            const size_t base = (size_t)(seq ? seq[t] : 0) * (size_t)max_ctx * kv_dim + head_off;
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
