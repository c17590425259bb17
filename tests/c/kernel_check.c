/* kernel_check.c — every kernel of every kernel table compiled for this target, against the
 * portable twin (the "generic" table), without Python: built from the C core's sources alone, so
 * it runs where the Python extension cannot be built or imported (under qemu-aarch64 on an x86
 * machine, as tests/test_c_driver.py does). Then whole tiny-model steps (files written by
 * tests/c/make_steps.py: a tape, its weights and the logits the generic table gave on the machine
 * that wrote them) run through the executor with every table.
 *
 * Contract checked: the activation quantizers give the generic bytes in every table; the integer
 * matmuls (q8, q4, x16 on every IG_WX_* layout) of the generic, NEON, avx2 and avx512 tables agree
 * bit for bit (arch/neon/neon.h, arch/avx2.c), those of the VNNI table within f32 rounding (its tiles
 * sum a row in vector lanes); the f32 and bf16 matmuls and attention within a normalised MSE. One
 * and two threads.
 *
 * usage: kernel_check [--threads N] [STEP_FILE...]; prints the CPU features and the table the
 * dispatcher picks ("best: NAME"), one line per table and kernel, and exits 1 on any failure.
 */
#define _POSIX_C_SOURCE 200112L   /* posix_memalign */
#include "ignis.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_failures;

/* ---- random numbers (xorshift64*): the same inputs on every target ---- */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 32);
}
static float rndf(void) { return (float)((double)rnd32() / 4294967296.0 * 2.0 - 1.0); }   /* [-1, 1) */
static void fill_f32(float *p, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) p[i] = rndf() * scale;
}
static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "kernel_check: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ---- comparisons ---- */
static double nmse(const float *got, const float *want, size_t n) {
    double err = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        err += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? err / den : err;
}

static void report_pairs(const float *got, const float *want, size_t n) {
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        if (d > worst || d != d) {
            worst = d;
            at = i;
        }
    }
    fprintf(stderr, "      max abs err %.3e at %zu; first pairs (got, want):", worst, at);
    for (size_t i = 0; i < n && i < 4; i++) fprintf(stderr, " (%.9g, %.9g)", got[i], want[i]);
    fprintf(stderr, "\n");
}

static double g_worst;   /* the largest nmse agree() saw since it was last reset */

/* exact: bit for bit; else nmse below tol. Returns 1 when it holds. */
static int agree(const char *what, const float *got, const float *want, size_t n, int exact, double tol) {
    g_checks++;
    int ok;
    double e = nmse(got, want, n);
    if (e > g_worst || e != e) g_worst = e;
    if (exact)
        ok = memcmp(got, want, n * sizeof(float)) == 0;
    else
        ok = e < tol;
    if (!ok) {
        g_failures++;
        fprintf(stderr, "FAIL %s: %s (nmse %.3e)\n", what, exact ? "not bit-identical" : "nmse above tolerance", e);
        report_pairs(got, want, n);
    }
    return ok;
}

/* The integer matmuls of a table that does not promise the twin's bits: its blocks' f32 sums in
 * another order, on dots that cancel (random weights, rows scaled 1e-3 to 30) */
#define INT_TOL 1e-8
/* The float matmuls: squared error over squared summed magnitudes (agree_scaled). Summed in
 * blocks or lanes, f32 rounding leaves ~2^-24 x sqrt(K) of the magnitudes in practice (worst seen
 * ~1e-14 squared, on every table), far below this; a wrong kernel is near 1/K. */
#define FLOAT_TOL 1e-12
/* A model step in an integer format against another build or table's: the float kernels' last
 * bits (f32 weights, attention, libm) can move an activation across a quantization boundary, one
 * step of 2^-8 (q8) or 2^-16 (x16) of its block's maximum; a wrong kernel gives nmse near 1 */
#define STEP_TOL 1e-5

/* Tables whose integer matmuls promise the twin's bits (arch/neon/neon.h); the x86 tables sum
 * their blocks in vector lanes and agree to rounding. */
static int exact_integer(const ig_kernel_table *t) {
    return strcmp(t->name, "generic") == 0 || strncmp(t->name, "neon", 4) == 0;
}

/* Tables whose integer matmuls are the twin's bits (model steps aside: their float kernels may
 * differ): those above, and the AVX2 kernels the avx2 and avx512 tables share (arch/avx2.c: exact
 * int32 block sums, the twin's f32 steps). The VNNI tiles sum a row in vector lanes. */
static int exact_integer_matmul(const ig_kernel_table *t) {
    return exact_integer(t) || strcmp(t->name, "avx2") == 0 || strcmp(t->name, "avx512") == 0;
}

/* ---- weights in each packing, random but valid: finite scales, q8 integers never -128 ---- */
typedef struct {
    const char *name;
    int packing, layout;
} wcase;

static const wcase WCASES[] = {
    {"f32", IG_PACK_F32, 0},        {"bf16", IG_PACK_BF16, 0},      {"q8", IG_PACK_Q8, 0},
    {"q4", IG_PACK_Q4, 0},          {"x16/Q8_0", IG_PACK_X16, IG_WX_Q8},
    {"x16/Q5_0", IG_PACK_X16, IG_WX_Q5_0}, {"x16/Q6_K", IG_PACK_X16, IG_WX_Q6K},
    {"x16/Q4_K", IG_PACK_X16, IG_WX_Q4K}, {"x16/Q4_1", IG_PACK_X16, IG_WX_Q4_1},
    {"x16/Q5_1", IG_PACK_X16, IG_WX_Q5_1}, {"x16/Q5_K", IG_PACK_X16, IG_WX_Q5K},
    {"x16/Q3_K", IG_PACK_X16, IG_WX_Q3K}, {"x16/Q2_K", IG_PACK_X16, IG_WX_Q2K},
};
#define N_WCASES ((int)(sizeof(WCASES) / sizeof(WCASES[0])))

/* A float matmul's error is judged against the size of what it sums, not of its result: a dot of
 * random weights may cancel to near 0 (a row of 3 outputs of K = 33 did, and its nmse against the
 * result's own norm sat at the tolerance). scale[r * N + n] bounds the error of output (r, n) in
 * units of f32 rounding: sum |x||w| of the dot (of both dots through SwiGLU's derivative), plus the
 * bias and residual added to it. f32 and bf16 weights are row-major [N][K]. */
static double wval(const wcase *c, const void *w, size_t i) {
    if (c->packing == IG_PACK_F32) return ((const float *)w)[i];
    const uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void float_scales(double *scale, const wcase *c, const void *w, const void *w2, const float *x,
                         int64_t ldx, const float *bias, const float *res, int64_t ldr, int mode,
                         int T, int N, int K) {
    for (int r = 0; r < T; r++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)r * ldx;
            double g = 0, mg = 0, u = 0, mu = 0;
            for (int k = 0; k < K; k++) {
                const double a = wval(c, w, (size_t)n * K + k);
                g += xr[k] * a;
                mg += fabs(xr[k] * a);
                if (mode == 2) {
                    const double b = wval(c, w2, (size_t)n * K + k);
                    u += xr[k] * b;
                    mu += fabs(xr[k] * b);
                }
            }
            double sc = mg;
            if (mode == 1) sc += fabs(bias[n]) + fabs(res[(size_t)r * ldr + n]);
            if (mode == 2) {    /* silu(g) * u: |silu'| <= 1.1 */
                const double silu = g / (1.0 + exp(-g));
                sc = 1.1 * fabs(u) * mg + fabs(silu) * mu;
            }
            scale[(size_t)r * N + n] = sc;
        }
}

/* sum (got - want)^2 / sum scale^2 below tol */
static int agree_scaled(const char *what, const float *got, const float *want, const double *scale,
                        size_t n, double tol) {
    g_checks++;
    double err = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        err += d * d;
        den += scale[i] * scale[i];
    }
    const double e = den > 0 ? err / den : err;
    if (e > g_worst || e != e) g_worst = e;
    if (e < tol) return 1;
    g_failures++;
    fprintf(stderr, "FAIL %s: error above tolerance (%.3e of the summed magnitudes)\n", what, e);
    report_pairs(got, want, n);
    return 0;
}

static void put_halves(uint8_t *p, int n, float scale) {
    for (int i = 0; i < n; i++) {
        const uint16_t h = ig_f32_to_f16(rndf() * scale);
        memcpy(p + 2 * i, &h, 2);
    }
}
static void put_floats(uint8_t *p, int n, float scale) {
    for (int i = 0; i < n; i++) {
        const float f = rndf() * scale;
        memcpy(p + 4 * i, &f, 4);
    }
}

/* An (N, K) weight in its packing: random bytes, then each group's scale regions made finite
 * (the layouts' regions as ignis.h describes them). */
static void *make_weight(const wcase *c, int N, int K) {
    if (c->packing == IG_PACK_F32) {
        float *w = xmalloc((size_t)N * K * sizeof(float));
        fill_f32(w, (size_t)N * K, 0.5f);
        return w;
    }
    if (c->packing == IG_PACK_BF16) {
        uint16_t *w = xmalloc((size_t)N * K * 2);
        for (size_t i = 0; i < (size_t)N * K; i++) {
            const float f = rndf() * 0.5f;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            w[i] = (uint16_t)(bits >> 16);
        }
        return w;
    }
    const int64_t bytes = ig_packed_bytes(c->packing, N, K, c->layout);
    const int64_t gb = ig_packed_bytes(c->packing, 4, K, c->layout);
    const int nb = K / IG_QK, nsup = (nb + 7) / 8;
    uint8_t *w = xmalloc((size_t)bytes);
    for (int64_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd32();
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    for (uint8_t *g = w; g < w + bytes; g += gb) {
        if (c->packing == IG_PACK_Q8 || (c->packing == IG_PACK_X16 && c->layout == IG_WX_Q8)) {
            put_halves(g, 4 * nb, 0.02f);
            for (int64_t i = 0; i < (int64_t)nb * 128; i++) g[sb + i] = (uint8_t)(1 + rnd32() % 255);
        } else if (c->packing == IG_PACK_Q4 || c->layout == IG_WX_Q5_0) {
            put_halves(g, 4 * nb, 0.05f);
        } else if (c->layout == IG_WX_Q4_1 || c->layout == IG_WX_Q5_1) {
            put_halves(g, 4 * nb, 0.05f);
            put_halves(g + sb, 4 * nb, 0.5f);
        } else if (c->layout == IG_WX_Q4K || c->layout == IG_WX_Q5K || c->layout == IG_WX_Q2K) {
            put_floats(g, 8 * nsup, 0.01f);          /* per super-block d[4], dmin[4] */
        } else {                                      /* IG_WX_Q6K, IG_WX_Q3K: d[4] */
            put_floats(g, 4 * nsup, 0.01f);
        }
    }
    return w;
}

static int64_t weight_bytes(const wcase *c, int N, int K) {
    if (c->packing == IG_PACK_F32) return (int64_t)N * K * 4;
    if (c->packing == IG_PACK_BF16) return (int64_t)N * K * 2;
    return ig_packed_bytes(c->packing, N, K, c->layout);
}

/* ---- the matmuls: every packing and layout, odd shapes, three epilogues, 1 and 2 threads ---- */
typedef struct {
    int T, N, K;
} shape;

static void check_matmuls(const ig_kernel_table *t, const ig_kernel_table *gen, int threads) {
    /* T = 1 with N > 32: decode's two streams a thread (avx512.c and avx2.c), 108 rows (27 groups
     * of 4) leaving a block whose partner is short by an odd number of groups; T = 1 with 3 groups
     * of 4 rows (11, 9): the decode tiles' last tile of one group */
    static const shape SMALL[] = {{1, 37, 96}, {2, 13, 32}, {3, 7, 416}, {5, 1, 96}, {9, 21, 160},
                                  {4, 4, 64}, {1, 5, 17}, {7, 3, 33}, {1, 108, 64}, {1, 11, 160}};
    static const shape KQ[] = {{1, 37, 256}, {2, 13, 768}, {3, 7, 256}, {5, 1, 512}, {9, 21, 256},
                               {4, 4, 768}, {1, 9, 512}};
    for (int ci = 0; ci < N_WCASES; ci++) {
        const wcase *c = &WCASES[ci];
        const int block = ig_packed_block(c->packing, c->layout);
        const int integer = c->packing >= IG_PACK_Q8;
        const int exact = integer && exact_integer_matmul(t);
        const ig_wformat *wf = &t->fns.wformat[c->packing], *gf = &gen->fns.wformat[c->packing];
        const shape *shapes = block == 256 ? KQ : SMALL;
        const int n_shapes = block == 256 ? (int)(sizeof KQ / sizeof KQ[0]) : (int)(sizeof SMALL / sizeof SMALL[0]);
        int ran = 0, ok = 1;
        g_worst = 0;
        for (int si = 0; si < n_shapes; si++) {
            const int T = shapes[si].T, N = shapes[si].N, K = shapes[si].K;
            if (K % block) continue;
            /* the up projection of a SwiGLU pair in another layout (x16 pairs may mix them) */
            wcase c2 = *c;
            if (c->packing == IG_PACK_X16) c2.layout = (c->layout + 1 + si) % IG_WX_COUNT;
            if (ig_packed_block(c2.packing, c2.layout) > block) c2.layout = c->layout;
            void *w = make_weight(c, N, K), *w2 = make_weight(&c2, N, K);
            const int64_t ldx = K + 3, ldo = N + 2, ldr = N + 1;
            float *x = xmalloc((size_t)T * ldx * 4), *bias = xmalloc((size_t)N * 4);
            float *res = xmalloc((size_t)T * ldr * 4);
            for (int r = 0; r < T; r++)           /* rows of different magnitudes */
                fill_f32(x + (size_t)r * ldx, (size_t)K, r % 3 == 0 ? 1.0f : r % 3 == 1 ? 30.0f : 1e-3f);
            fill_f32(bias, (size_t)N, 1.0f);
            fill_f32(res, (size_t)T * ldr, 1.0f);
            const int nb = K / IG_QK;
            void *act = x;
            float *xsum = NULL;
            if (wf->act == IG_ACT_Q8) {
                act = xmalloc((size_t)T * nb * sizeof(ig_block_q8));
                gen->fns.quantize_q8_rows(act, x, ldx, T, K);
            } else if (wf->act == IG_ACT_X16) {
                act = xmalloc((size_t)T * nb * sizeof(ig_block_x16));
                xsum = xmalloc((size_t)T * nb * 4);
                gen->fns.quantize_x16_rows(act, xsum, x, ldx, T, K);
            }
            for (int mode = 0; mode < 3; mode++) {          /* plain, bias + residual, SwiGLU */
                float *want = xmalloc((size_t)T * ldo * 4), *got = xmalloc((size_t)T * ldo * 4);
                double *scale = NULL;
                if (!integer) {
                    scale = xmalloc((size_t)T * N * sizeof(double));
                    float_scales(scale, c, w, w2, x, ldx, bias, res, ldr, mode, T, N, K);
                }
                ig_matmul_args a = {0};
                a.x = act;
                a.xsum = xsum;
                a.w = w;
                a.w2 = mode == 2 ? w2 : NULL;
                a.bias = mode == 1 ? bias : NULL;
                a.res = mode == 1 ? res : NULL;
                a.ldo = ldo;
                a.ldx = ldx;
                a.ldr = ldr;
                a.T = T;
                a.N = N;
                a.K = K;
                a.layout = c->layout;
                a.layout2 = c2.layout;
                a.out = want;
                gf->matmul(&a, 1);
                for (int th = 1; th <= threads; th++) {
                    for (size_t i = 0; i < (size_t)T * ldo; i++) got[i] = -7.0f;   /* the gaps stay */
                    a.out = got;
                    wf->matmul(&a, th);
                    char what[160];
                    snprintf(what, sizeof what, "%s matmul %s T=%d N=%d K=%d %s threads=%d", t->name,
                             c->name, T, N, K, mode == 0 ? "plain" : mode == 1 ? "bias+res" : "swiglu", th);
                    /* only columns [0, N) of each row are written: compare rows */
                    for (int r = 0; r < T; r++) {
                        float *g = got + (size_t)r * ldo, *wv = want + (size_t)r * ldo;
                        ok &= integer ? agree(what, g, wv, (size_t)N, exact, INT_TOL)
                                      : agree_scaled(what, g, wv, scale + (size_t)r * N, (size_t)N,
                                                     FLOAT_TOL);
                        for (int j = N; j < ldo; j++)
                            if (g[j] != -7.0f) {
                                g_failures++;
                                ok = 0;
                                fprintf(stderr, "FAIL %s: wrote column %d past N\n", what, j);
                            }
                    }
                    ran++;
                }
                free(want);
                free(got);
                free(scale);
            }
            if (act != x) free(act);
            free(xsum);
            free(x);
            free(bias);
            free(res);
            free(w);
            free(w2);
        }
        printf("%-12s matmul %-9s %3d runs  %s  %s (worst %.1e)%s\n", t->name, c->name, ran,
               ok ? "ok  " : "FAIL", exact ? "bit-identical to generic" : integer ? "nmse < 1e-8"
               : "error < 1e-12 of sum |x||w|",
               g_worst, wf->matmul == gf->matmul ? " (the generic function)" : "");
    }
}

/* ---- activation quantizers: the generic bytes and sums, edge cases included ---- */
static float f32_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t f32_u32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Blocks at the floats' corners, one per case. The twin defines each: the block's scale is
 * max |x| / 127 (/ 32512 for x16), max |x| taken by bits so a NaN anywhere makes it NaN; when the
 * inverse scale is 0 or not finite (a zero or denormal maximum, one so small that 127 / max
 * overflows, an inf or a NaN in the block) every integer of the block is 0. */
enum { QX_DENORMAL, QX_FLT_MIN, QX_FLT_MIN_LAST, QX_1E37, QX_4E37, QX_SIGNED_ZEROS, QX_NEG_ZEROS,
       QX_FLT_MAX, QX_NEAR_MAX, QX_INF, QX_NEG_INF, QX_NAN_FIRST, QX_NAN_MID, QX_NAN_LAST, QX_ALL_NAN,
       QX_NAN_INF, QX_NEG_NAN, QX_PLAIN, QX_COUNT };

static void fill_extremes(float *x) {
    for (int b = 0; b < QX_COUNT; b++) {
        float *v = x + (size_t)b * IG_QK;
        for (int i = 0; i < IG_QK; i++) v[i] = rndf();       /* finite, |v| < 1 unless set below */
        for (int i = 0; i < IG_QK; i++) {
            const float f = (float)(i - 16) / 16.0f;         /* -1 at i = 0 */
            switch (b) {
            case QX_DENORMAL: v[i] = 1e-40f * (float)(i - 16); break;
            case QX_FLT_MIN: v[i] = FLT_MIN * f; break;      /* max exactly FLT_MIN, denormals below */
            case QX_FLT_MIN_LAST: v[i] = i == 31 ? FLT_MIN : (i & 1) ? -0.0f : 0.0f; break;
            case QX_1E37: v[i] = 1e-37f * f; break;           /* normal, 127 / max overflows */
            case QX_4E37: v[i] = 4e-37f * f; break;           /* 127 / max finite, 32512 / max not */
            case QX_SIGNED_ZEROS: v[i] = (i % 3) ? -0.0f : 0.0f; break;
            case QX_NEG_ZEROS: v[i] = -0.0f; break;
            case QX_FLT_MAX: if (i % 8 == 3) v[i] = (i & 8) ? -FLT_MAX : FLT_MAX; break;
            case QX_NEAR_MAX: v[i] *= 3e38f; break;
            case QX_INF: if (i == 7) v[i] = INFINITY; break;
            case QX_NEG_INF: if (i == 31) v[i] = -INFINITY; break;
            case QX_NAN_FIRST: if (i == 0) v[i] = NAN; break;
            case QX_NAN_MID: if (i == 17) v[i] = NAN; break;
            case QX_NAN_LAST: if (i == 31) v[i] = NAN; break;
            case QX_ALL_NAN: v[i] = NAN; break;
            case QX_NAN_INF:        /* two NaN payloads and an inf: the NaN with the larger bits wins */
                if (i == 2) v[i] = f32_bits(0x7fc00001u);
                if (i == 20) v[i] = f32_bits(0xffc00005u);
                if (i == 9) v[i] = -INFINITY;
                break;
            case QX_NEG_NAN: if (i == 3) v[i] = -NAN; break;
            default: break;
            }
        }
    }
}

static void check_quantizer_extremes(const ig_kernel_table *t, const ig_kernel_table *gen) {
    const int K = QX_COUNT * IG_QK, nb = QX_COUNT;
    float *x = xmalloc((size_t)K * 4);
    fill_extremes(x);
    ig_block_q8 *q1 = xmalloc((size_t)nb * sizeof *q1), *q2 = xmalloc((size_t)nb * sizeof *q2);
    ig_block_x16 *a1 = xmalloc((size_t)nb * sizeof *a1), *a2 = xmalloc((size_t)nb * sizeof *a2);
    float *s1 = xmalloc((size_t)nb * 4), *s2 = xmalloc((size_t)nb * 4);
    gen->fns.quantize_q8_rows(q1, x, K, 1, K);
    t->fns.quantize_q8_rows(q2, x, K, 1, K);
    gen->fns.quantize_x16_rows(a1, s1, x, K, 1, K);
    t->fns.quantize_x16_rows(a2, s2, x, K, 1, K);
    int ok = 1;
    for (int b = 0; b < nb; b++) {
        /* the twin's definition, then the table against the twin, bit for bit */
        const int finite_max = b == QX_FLT_MAX || b == QX_NEAR_MAX || b == QX_PLAIN;
        int any8 = 0, any16 = 0;
        for (int i = 0; i < IG_QK; i++) {
            any8 |= q1[b].qs[i] != 0;
            any16 |= a1[b].hi[i] != 0 || a1[b].lo[i] != 0;
        }
        /* 4e-37: 127 / max is finite (the -1 * max lane is -127), 32512 / max is not */
        int twin = any16 == finite_max && (b == QX_4E37 ? q1[b].qs[0] == -127 : any8 == finite_max);
        const int nan_block = (b >= QX_NAN_FIRST && b <= QX_NAN_INF) || b == QX_NEG_NAN;
        twin &= nan_block == (isnan(q1[b].d) && isnan(a1[b].d));
        if (b == QX_INF || b == QX_NEG_INF) twin &= isinf(q1[b].d) && isinf(a1[b].d);
        if (!twin) {
            g_failures++;
            ok = 0;
            fprintf(stderr, "FAIL %s quantizers at extreme block %d: the generic twin breaks its definition\n",
                    t->name, b);
        }
        if (memcmp(&q1[b], &q2[b], sizeof *q1) != 0) {
            g_failures++;
            ok = 0;
            fprintf(stderr, "FAIL %s quantize_q8_rows at extreme block %d: d %08x vs generic %08x, qs[0..3] "
                    "%d %d %d %d vs %d %d %d %d\n", t->name, b, (unsigned)f32_u32(q2[b].d),
                    (unsigned)f32_u32(q1[b].d), q2[b].qs[0], q2[b].qs[1], q2[b].qs[2], q2[b].qs[3],
                    q1[b].qs[0], q1[b].qs[1], q1[b].qs[2], q1[b].qs[3]);
        }
        /* sums: the same bits, or both NaN (which of two NaNs an add returns is the compiler's
         * choice of operand order) */
        const int sums = memcmp(&s1[b], &s2[b], 4) == 0 || (isnan(s1[b]) && isnan(s2[b]));
        if (memcmp(&a1[b], &a2[b], sizeof *a1) != 0 || !sums) {
            g_failures++;
            ok = 0;
            fprintf(stderr, "FAIL %s quantize_x16_rows at extreme block %d: bytes or sum differ from generic\n",
                    t->name, b);
        }
    }
    g_checks++;
    printf("%-12s quantizer extremes   %s  %d blocks (denormal, FLT_MIN, FLT_MAX, +-0, inf, NaN) as "
           "the twin defines them\n", t->name, ok ? "ok  " : "FAIL", nb);
    free(x), free(q1), free(q2), free(a1), free(a2), free(s1), free(s2);
}

static void check_quantizers(const ig_kernel_table *t, const ig_kernel_table *gen) {
    const int T = 6, K = 256, nb = K / IG_QK;
    float *x = xmalloc((size_t)T * K * 4);
    for (int r = 0; r < T; r++) fill_f32(x + (size_t)r * K, (size_t)K, r == 5 ? 1e-3f : 3.0f);
    for (int i = 0; i < 32; i++) x[K + i] = 0.0f;                    /* an all-zero block */
    for (int i = 0; i < 32; i++) x[2 * K + 32 + i] = (float)i - 15.5f;   /* ties to even */
    x[3 * K + 5] = -1e4f;                                             /* one outlier */
    ig_block_q8 *q1 = xmalloc((size_t)T * nb * sizeof *q1), *q2 = xmalloc((size_t)T * nb * sizeof *q2);
    for (int i = 0; i < 32; i++) x[4 * K + 64 + i] = 1e-40f * (float)(i - 16);   /* denormals */
    gen->fns.quantize_q8_rows(q1, x, K, T, K);
    t->fns.quantize_q8_rows(q2, x, K, T, K);
    g_checks++;
    int ok8 = memcmp(q1, q2, (size_t)T * nb * sizeof *q1) == 0;
    if (!ok8) {
        g_failures++;
        fprintf(stderr, "FAIL %s quantize_q8_rows: bytes differ from generic\n", t->name);
    }
    ig_block_x16 *a1 = xmalloc((size_t)T * nb * sizeof *a1), *a2 = xmalloc((size_t)T * nb * sizeof *a2);
    float *s1 = xmalloc((size_t)T * nb * 4), *s2 = xmalloc((size_t)T * nb * 4);
    gen->fns.quantize_x16_rows(a1, s1, x, K, T, K);
    t->fns.quantize_x16_rows(a2, s2, x, K, T, K);
    g_checks++;
    int ok16 = memcmp(a1, a2, (size_t)T * nb * sizeof *a1) == 0 && memcmp(s1, s2, (size_t)T * nb * 4) == 0;
    if (!ok16) {
        g_failures++;
        fprintf(stderr, "FAIL %s quantize_x16_rows: bytes or sums differ from generic\n", t->name);
    }
    printf("%-12s quantize_q8_rows     %s  bytes identical to generic%s\n", t->name, ok8 ? "ok  " : "FAIL",
           t->fns.quantize_q8_rows == gen->fns.quantize_q8_rows ? " (the generic function)" : "");
    printf("%-12s quantize_x16_rows    %s  bytes and sums identical to generic%s\n", t->name,
           ok16 ? "ok  " : "FAIL",
           t->fns.quantize_x16_rows == gen->fns.quantize_x16_rows ? " (the generic function)" : "");
    free(x), free(q1), free(q2), free(a1), free(a2), free(s1), free(s2);
    check_quantizer_extremes(t, gen);
}

/* ---- attention: f32 and f16 caches, two sequences, windows, a ring, odd head sizes ---- */
static void check_attention(const ig_kernel_table *t, const ig_kernel_table *gen, int threads) {
    static const int HEAD_DIMS[] = {64, 128, 40};
    /* its own random stream: the cache's size (whole key blocks) does not move the numbers every
     * later check draws (neon's bf16 swiglu sits near its tolerance on some of them) */
    const uint64_t rng_after = g_rng;
    g_rng = 0x2545F4914F6CDD1Dull;
    int ok = 1, ran = 0;
    for (int hi = 0; hi < 3; hi++)
        for (int kv_f16 = 0; kv_f16 < 2; kv_f16++)
            for (int variant = 0; variant < 3; variant++) {     /* full cache; window; ring */
                const int head_dim = HEAD_DIMS[hi], n_heads = 4, n_kv = 2, max_ctx = 40, T = 5;
                /* kv_rows in whole key blocks (IG_KV_BLOCK): max_ctx rounded up, or a ring */
                const int window = variant ? 7 : 0, kv_rows = variant == 2 ? 16 : 48;
                const int kv_dim = n_kv * head_dim, n_seq = 2;
                const int64_t ldq = n_heads * head_dim + 3, ldo = n_heads * head_dim + 1;
                float *q = xmalloc((size_t)T * ldq * 4);
                fill_f32(q, (size_t)T * ldq, 1.0f);
                const size_t cache = (size_t)n_seq * kv_rows * kv_dim;
                void *kc = xmalloc(cache * 4), *vc = xmalloc(cache * 4);
                float *kf = kc, *vf = vc;
                fill_f32(kf, cache, 1.0f);
                fill_f32(vf, cache, 1.0f);
                if (kv_f16) {
                    ig_f32_to_f16_row(kc, kf, (int64_t)cache);
                    ig_f32_to_f16_row(vc, vf, (int64_t)cache);
                }
                int32_t pos[5] = {0, 3, 9, 20, 39}, seq[5] = {0, 1, 1, 0, 1};
                if (variant == 2)
                    for (int i = 0; i < T; i++) pos[i] = 28 + i;   /* wraps the 16-row ring */
                float *scratch = xmalloc((size_t)n_heads * max_ctx * 4);
                float *want = xmalloc((size_t)T * ldo * 4), *got = xmalloc((size_t)T * ldo * 4);
                gen->fns.attention_f32(want, ldo, q, ldq, kc, vc, kv_f16, pos, seq, scratch, T, n_heads,
                                       n_kv, head_dim, max_ctx, kv_rows, 0.125f, window, 1);
                for (int th = 1; th <= threads; th++) {
                    t->fns.attention_f32(got, ldo, q, ldq, kc, vc, kv_f16, pos, seq, scratch, T,
                                         n_heads, n_kv, head_dim, max_ctx, kv_rows, 0.125f, window, th);
                    char what[128];
                    snprintf(what, sizeof what, "%s attention head_dim=%d kv_%s window=%d kv_rows=%d threads=%d",
                             t->name, head_dim, kv_f16 ? "f16" : "f32", window, kv_rows, th);
                    for (int r = 0; r < T; r++)
                        ok &= agree(what, got + (size_t)r * ldo, want + (size_t)r * ldo,
                                    (size_t)n_heads * head_dim, 0, 1e-10);
                    ran++;
                }
                free(q), free(kc), free(vc), free(scratch), free(want), free(got);
            }
    g_rng = rng_after;
    printf("%-12s attention_f32 %3d runs  %s  nmse < 1e-10%s\n", t->name, ran, ok ? "ok  " : "FAIL",
           t->fns.attention_f32 == gen->fns.attention_f32 ? " (the generic function)" : "");
}

/* ---- attention on a thread with a small stack: a caller's thread may have 128 KiB (musl's
 * default) or less, and the tiled path's ~105 KiB tile must not live on it ---- */
typedef struct {
    const ig_kernel_table *t;
    float *out;
    const float *q;
    const void *kc, *vc;
    const int32_t *pos, *seq;
    float *scratch;
    int T, head_dim, kv_rows, threads;
    int pooled;         /* through ig_call_attention (its status in status), else the kernel itself */
    ig_status status;
} small_stack_call;

enum { SMALL_STACK_BYTES = 64 * 1024 };

/* posix_memalign as this program sees it (the C core's included: ig_thread_scratch), failing while
 * g_fail_alloc is set */
static int g_fail_alloc;
int posix_memalign(void **p, size_t align, size_t n) {
    if (g_fail_alloc) return ENOMEM;
    *p = aligned_alloc(align, (n + align - 1) / align * align);
    return *p ? 0 : ENOMEM;
}

static void small_stack_run(small_stack_call *c) {
    const int hd = c->head_dim;
    if (c->pooled)
        c->status = ig_call_attention(&c->t->fns, c->out, 4 * hd, c->q, 4 * hd, c->kc, c->vc, 0, c->pos,
                                      c->seq, c->scratch, c->T, 4, 2, hd, 40, c->kv_rows, 0.125f, 0,
                                      c->threads);
    else
        c->t->fns.attention_f32(c->out, 4 * hd, c->q, 4 * hd, c->kc, c->vc, 0, c->pos, c->seq,
                                c->scratch, c->T, 4, 2, hd, 40, c->kv_rows, 0.125f, 0, c->threads);
}

static void *small_stack_main(void *p) {
    small_stack_run(p);
    return NULL;
}

/* c on a new thread with a stack of `stack` bytes; 0 when it could not run */
static int on_small_stack(small_stack_call *c, size_t stack) {
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    int rc = pthread_attr_setstacksize(&attr, stack);
    if (rc == 0) rc = pthread_create(&th, &attr, small_stack_main, c);
    pthread_attr_destroy(&attr);
    return rc == 0 && pthread_join(th, NULL) == 0;
}

/* The tiled path (head_dim 64, 128; decode's one row and a prefill's five) on a thread with a
 * 64 KiB stack: the kernel called directly, and through ig_call_attention on 2 threads (the small
 * thread is the job's caller); the main thread's bits. Once (the first table): a caller whose
 * scratch cannot be allocated gets IG_ERR_NOMEM and nothing written, then the call works. */
static void check_attention_small_stack(const ig_kernel_table *t, int check_nomem) {
    int ok = 1;
    size_t stack = SMALL_STACK_BYTES;
    if (stack < (size_t)PTHREAD_STACK_MIN) stack = PTHREAD_STACK_MIN;   /* aarch64 glibc: 128 KiB */
    for (int hd = 64; hd <= 128; hd *= 2)
        for (int T = 1; T <= 5; T += 4) {
            const int kv_rows = 48, width = 2 * hd;
            const size_t cache = (size_t)kv_rows * width, n_out = (size_t)T * 4 * hd;
            float *q = xmalloc(n_out * 4), *kc = xmalloc(cache * 4), *vc = xmalloc(cache * 4);
            fill_f32(q, n_out, 1.0f);
            fill_f32(kc, cache, 1.0f);
            fill_f32(vc, cache, 1.0f);
            int32_t pos[5] = {39, 3, 9, 20, 39}, seq[5] = {0};
            float *scratch = xmalloc((size_t)4 * 40 * 4);
            float *want = xmalloc(n_out * 4), *got = xmalloc(n_out * 4);
            small_stack_call c = {t, want, q, kc, vc, pos, seq, scratch, T, hd, kv_rows, 1, 0, IG_OK};
            small_stack_run(&c);                           /* on this thread */
            c.out = got;
            for (int pooled = 0; pooled < 2; pooled++) {
                c.pooled = pooled;
                c.threads = pooled ? 2 : 1;
                for (int nomem = pooled && check_nomem && hd == 64 && T == 1; nomem >= 0; nomem--) {
                    for (size_t i = 0; i < n_out; i++) got[i] = -7.0f;
                    g_fail_alloc = nomem;
                    const int ran = on_small_stack(&c, stack);
                    g_fail_alloc = 0;
                    g_checks++;
                    int good = ran;
                    if (!ran)
                        fprintf(stderr, "FAIL %s: cannot run a thread with a %zu-byte stack\n", t->name, stack);
                    else if (nomem) {
                        good = c.status == IG_ERR_NOMEM;
                        for (size_t i = 0; i < n_out; i++) good &= got[i] == -7.0f;
                        if (!good)
                            fprintf(stderr, "FAIL %s: ig_call_attention without scratch gave status %d "
                                    "(want IG_ERR_NOMEM) or wrote its output\n", t->name, (int)c.status);
                    } else if ((pooled && c.status != IG_OK) || memcmp(got, want, n_out * 4) != 0) {
                        good = 0;
                        fprintf(stderr, "FAIL %s attention on a %zu-byte stack (%s): head_dim=%d T=%d "
                                "differs from the same call on the main thread\n", t->name, stack,
                                pooled ? "ig_call_attention, 2 threads" : "the kernel", hd, T);
                    }
                    if (!good) ok = 0, g_failures++;
                }
            }
            free(q), free(kc), free(vc), free(scratch), free(want), free(got);
        }
    printf("%-12s attention small-stack %s  on a %zu KiB thread stack, the main thread's bits%s\n",
           t->name, ok ? "ok  " : "FAIL", stack / 1024,
           check_nomem ? "; IG_ERR_NOMEM without scratch" : "");
}

/* ig_thread_scratch's contract: a failed growth returns NULL and keeps the buffer it had */
static void check_thread_scratch(void) {
    void *a = ig_thread_scratch(1000);
    void *huge = ig_thread_scratch(SIZE_MAX / 2);
    void *b = ig_thread_scratch(1000);
    g_fail_alloc = 1;
    void *c = ig_thread_scratch(4000);          /* a growth that fails */
    g_fail_alloc = 0;
    void *d = ig_thread_scratch(64);
    g_checks++;
    const int ok = a && ((uintptr_t)a & 63) == 0 && !huge && b == a && !c && d == a;
    if (!ok) {
        g_failures++;
        fprintf(stderr, "FAIL ig_thread_scratch: %p %p %p %p %p\n", a, huge, b, c, d);
    }
    printf("thread scratch: %s  aligned, kept, NULL when it cannot grow\n", ok ? "ok  " : "FAIL");
}

/* ---- whole model steps (tests/c/make_steps.py writes the files) ---- */
typedef struct {
    const uint8_t *p, *end;
    const char *path;
} reader;

static const void *take(reader *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) {
        fprintf(stderr, "kernel_check: %s is cut short\n", r->path);
        exit(2);
    }
    const void *at = r->p;
    r->p += n;
    return at;
}
static int32_t take_i32(reader *r) { int32_t v; memcpy(&v, take(r, 4), 4); return v; }
static int64_t take_i64(reader *r) { int64_t v; memcpy(&v, take(r, 8), 8); return v; }

/* a copy at 64-byte alignment (the packed layouts are read with vector loads) */
static void *aligned_copy(const void *src, size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) {
        fprintf(stderr, "kernel_check: out of memory\n");
        exit(2);
    }
    memcpy(p, src, n);
    return p;
}

static void check_step_file(const char *path, int threads) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL cannot open step file %s\n", path);
        g_failures++;
        return;
    }
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = xmalloc((size_t)size);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "kernel_check: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    reader r = {buf, buf + size, path};
    if (memcmp(take(&r, 8), "IGSTEP1\0", 8) != 0) {
        fprintf(stderr, "kernel_check: %s is not a step file (tests/c/make_steps.py)\n", path);
        exit(2);
    }
    const int32_t isz = take_i32(&r), n_instrs = take_i32(&r);
    if (isz != (int32_t)ig_instr_size()) {
        fprintf(stderr, "kernel_check: %s has %d-byte instructions, this build %zu\n", path, isz, ig_instr_size());
        exit(2);
    }
    ig_instr *instrs = aligned_copy(take(&r, (size_t)isz * n_instrs), (size_t)isz * n_instrs);
    const int n_w = take_i32(&r);
    const float **weights = xmalloc(sizeof(float *) * (n_w + 1));
    ig_packed_weight *packed = xmalloc(sizeof(ig_packed_weight) * (n_w + 1));
    int64_t *rows = xmalloc(8 * (n_w + 1)), *elems = xmalloc(8 * (n_w + 1));
    int integer = 0;
    char layouts[128] = "";
    for (int i = 0; i < n_w; i++) {
        rows[i] = take_i64(&r);
        elems[i] = take_i64(&r);
        weights[i] = aligned_copy(take(&r, (size_t)elems[i] * 4), (size_t)elems[i] * 4);
        const int32_t pk = take_i32(&r), lay = take_i32(&r);
        const int64_t nbytes = take_i64(&r);
        packed[i].packing = pk < 0 ? IG_PACK_F32 : pk;
        packed[i].layout = pk < 0 ? 0 : lay;
        packed[i].w = pk < 0 ? NULL : aligned_copy(take(&r, (size_t)nbytes), (size_t)nbytes);
        if (pk == IG_PACK_X16) {
            char one[8];
            snprintf(one, sizeof one, "%d", lay);
            if (!strstr(layouts, one) && strlen(layouts) < 100) {
                strcat(layouts, layouts[0] ? "," : "");
                strcat(layouts, one);
            }
        }
    }
    /* integer: every matrix a matmul reads is in an integer packing (a GGUF file's F16 matrix, say,
     * runs the f32 matmul, whose sums differ by table) */
    for (int i = 0; i < n_instrs; i++) {
        const ig_op_info *op = ig_op_info_of(instrs[i].opcode);
        if (!op || !strstr(op->name, "linear")) continue;
        for (int j = 0; j < instrs[i].n_weights; j++) {
            const int w = instrs[i].weight[j];
            if (w < 0 || w >= n_w || elems[w] <= rows[w]) continue;       /* vectors: norms, biases */
            if (integer == 0) integer = 1;
            if (packed[w].packing < IG_PACK_Q8) integer = -1;
        }
    }
    integer = integer > 0;
    ig_model_desc d = {0};
    d.instrs = instrs;
    d.n_instrs = n_instrs;
    d.weights = weights;
    d.packed = packed;
    d.weight_rows = rows;
    d.weight_elems = elems;
    d.n_weights = n_w;
    d.n_inputs = take_i32(&r);
    d.n_outputs = take_i32(&r);
    d.arena_bytes = take_i64(&r);
    d.scratch_bytes = take_i64(&r);
    d.max_T = take_i32(&r);
    d.max_R = take_i32(&r);
    d.max_ctx = take_i32(&r);
    d.n_seq = take_i32(&r);
    d.kv_f16 = take_i32(&r);
    d.n_kv_layers = take_i32(&r);
    int32_t *kvw = xmalloc(4 * (d.n_kv_layers + 1));
    memcpy(kvw, take(&r, 4 * (size_t)d.n_kv_layers), 4 * (size_t)d.n_kv_layers);
    d.kv_widths = kvw;
    const int n_steps = take_i32(&r);
    const uint8_t *steps = r.p;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    float **target_generic = xmalloc(sizeof(float *) * (size_t)n_steps * d.n_outputs);

    for (int ti = 0; ti < ig_kernel_table_count(); ti++) {
        const ig_kernel_table *t = ig_kernel_table_at(ti);
        if (!ig_kernel_table_eligible(t)) continue;
        for (int th = 1; th <= threads; th++) {
            d.kernels = t;
            ig_model *m = NULL;
            char err[512] = "";
            if (ig_model_create(&m, &d, err, sizeof err) != IG_OK) {
                fprintf(stderr, "FAIL %s with %s: the executor refused the tape: %s\n", name, t->name, err);
                g_failures++;
                continue;
            }
            const void **ins = xmalloc(sizeof(void *) * (d.n_inputs + 1));
            float **outs = xmalloc(sizeof(float *) * (d.n_outputs + 1));
            int64_t *out_n = xmalloc(8 * (d.n_outputs + 1));
            reader s = {steps, r.end, path};
            double worst = 0;
            int ok = 1;
            for (int k = 0; k < n_steps; k++) {
                const int T = take_i32(&s), R = take_i32(&s);
                for (int i = 0; i < d.n_inputs; i++) {
                    const int64_t nbytes = take_i64(&s);
                    ins[i] = aligned_copy(take(&s, (size_t)nbytes), (size_t)nbytes);
                }
                const float **want = xmalloc(sizeof(float *) * (d.n_outputs + 1));
                for (int i = 0; i < d.n_outputs; i++) {
                    out_n[i] = take_i64(&s);
                    want[i] = take(&s, (size_t)out_n[i] * 4);
                    if (k == 0) outs[i] = xmalloc((size_t)out_n[i] * 4);   /* zeros, as the Engine's */
                }
                int failed = -1;
                if (ig_model_step(m, ins, outs, T, R, NULL, th, &failed) != IG_OK) {
                    fprintf(stderr, "FAIL %s with %s: step %d failed at instruction %d: %s\n", name, t->name,
                            k, failed, ig_model_error(m));
                    g_failures++;
                    ok = 0;
                    break;
                }
                for (int i = 0; i < d.n_outputs; i++) {
                    char what[160];
                    snprintf(what, sizeof what, "%s step %d (T=%d) with %s threads=%d vs the writer's generic logits",
                             name, k, T, t->name, th);
                    /* another machine's libm (expf, sinf) and compiler: agreement, not identity; a
                     * last-bit difference may move a quantized activation by one step */
                    ok &= agree(what, outs[i], want[i], (size_t)out_n[i], 0, integer ? STEP_TOL : 1e-8);
                    const double e = nmse(outs[i], want[i], (size_t)out_n[i]);
                    if (e > worst) worst = e;
                    float **mine = &target_generic[(size_t)k * d.n_outputs + i];
                    if (strcmp(t->name, "generic") == 0 && th == 1) {
                        *mine = xmalloc((size_t)out_n[i] * 4);
                        memcpy(*mine, outs[i], (size_t)out_n[i] * 4);
                    } else {
                        /* this target's generic table: the integer formats bit for bit where the
                         * table promises it, else within f32 rounding */
                        snprintf(what, sizeof what, "%s step %d (T=%d) with %s threads=%d vs this target's generic",
                                 name, k, T, t->name, th);
                        ok &= agree(what, outs[i], *mine, (size_t)out_n[i], integer && exact_integer(t),
                                    integer ? STEP_TOL : 1e-10);
                    }
                }
                for (int i = 0; i < d.n_inputs; i++) free((void *)ins[i]);
                free(want);
            }
            printf("%-12s step %-15s %d steps threads=%d  %s  nmse vs writer %.1e%s%s%s\n", t->name, name,
                   n_steps, th, ok ? "ok  " : "FAIL", worst,
                   strcmp(t->name, "generic") == 0 && th == 1 ? ""
                   : integer && exact_integer(t) ? ", bit-identical to this target's generic"
                   : integer ? ", nmse < 1e-5 vs this target's generic" : ", nmse < 1e-10 vs this target's generic",
                   layouts[0] ? "; x16 layouts " : "", layouts);
            for (int i = 0; i < d.n_outputs; i++) free(outs[i]);
            free(ins), free(outs), free(out_n);
            ig_model_free(m);
        }
    }
    free(buf);
}

/* --count TABLE FORMAT T N K RUN: one matmul of that table (RUN 1) or only its inputs (RUN 0), on
 * one thread, for counting the instructions it executes (benchmarks/neon_icount.py runs this
 * under qemu -singlestep and takes differences, so the setup cancels out). */
static int count_mode(char **argv) {
    const ig_kernel_table *t = ig_kernel_table_find(argv[0]), *gen = ig_kernel_table_find("generic");
    const wcase *c = NULL;
    for (int i = 0; i < N_WCASES; i++)
        if (strcmp(WCASES[i].name, argv[1]) == 0) c = &WCASES[i];
    const int T = atoi(argv[2]), N = atoi(argv[3]), K = atoi(argv[4]), run = atoi(argv[5]);
    if (!t || !c || T < 1 || N < 1 || K < 1 || K % ig_packed_block(c->packing, c->layout)) {
        fprintf(stderr, "kernel_check --count: unknown table or format, or a bad shape\n");
        return 2;
    }
    if (!ig_kernel_table_eligible(t)) {
        fprintf(stderr, "kernel_check --count: table %s is not eligible on this CPU\n", t->name);
        return 2;
    }
    void *w = make_weight(c, N, K);
    float *x = xmalloc((size_t)T * K * 4), *out = xmalloc((size_t)T * N * 4), *xsum = NULL;
    fill_f32(x, (size_t)T * K, 1.0f);
    void *act = x;
    const ig_wformat *wf = &t->fns.wformat[c->packing];
    if (wf->act == IG_ACT_Q8) {
        act = xmalloc((size_t)T * (K / IG_QK) * sizeof(ig_block_q8));
        gen->fns.quantize_q8_rows(act, x, K, T, K);
    } else if (wf->act == IG_ACT_X16) {
        act = xmalloc((size_t)T * (K / IG_QK) * sizeof(ig_block_x16));
        xsum = xmalloc((size_t)T * (K / IG_QK) * 4);
        gen->fns.quantize_x16_rows(act, xsum, x, K, T, K);
    }
    ig_matmul_args a = {0};
    a.out = out;
    a.x = act;
    a.xsum = xsum;
    a.w = w;
    a.ldo = N;
    a.ldx = K;
    a.T = T;
    a.N = N;
    a.K = K;
    a.layout = c->layout;
    if (run) wf->matmul(&a, 1);
    printf("%g\n", (double)out[0]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 8 && strcmp(argv[1], "--count") == 0) return count_mode(argv + 2);
    int threads = 2, first_file = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
            if (threads < 1) threads = 1;
        } else {
            first_file = i;
            break;
        }
    }
    const uint32_t f = ig_cpu_features();
    printf("features:");
    for (int b = 0; ig_cpu_feature_name(b); b++)
        if (f & (1u << b)) printf(" %s", ig_cpu_feature_name(b));
    printf("\ntables:");
    for (int i = 0; i < ig_kernel_table_count(); i++)
        printf(" %s%s", ig_kernel_table_at(i)->name, ig_kernel_table_eligible(ig_kernel_table_at(i)) ? "" : "(not-eligible)");
    printf("\nbest: %s\nopenmp: %d\n", ig_kernel_table_best()->name, ig_openmp_enabled());
    const ig_kernel_table *gen = ig_kernel_table_find("generic");
    check_thread_scratch();
    for (int i = 0; i < ig_kernel_table_count(); i++) {
        const ig_kernel_table *t = ig_kernel_table_at(i);
        if (!ig_kernel_table_eligible(t)) continue;
        check_quantizers(t, gen);
        check_matmuls(t, gen, threads);
        check_attention(t, gen, threads);
        check_attention_small_stack(t, i == 0);
        const int rows_shared = t->fns.rmsnorm_f32 == gen->fns.rmsnorm_f32 && t->fns.rope_f32 == gen->fns.rope_f32 &&
                                t->fns.eltwise_f32 == gen->fns.eltwise_f32;
        printf("%-12s rmsnorm, rope, eltwise: %s\n", t->name,
               rows_shared ? "the generic functions" : "own versions (checked by the tape steps only)");
    }
    for (int i = first_file; i < argc; i++) check_step_file(argv[i], threads);
    printf("kernel_check: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
