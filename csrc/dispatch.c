/* dispatch.c — CPU feature detection (once) and the kernel tables it chooses between. */
#include "ignis.h"
#if defined(IGNIS_ARCH_X86)
#  include "arch/x86.h"
#endif
#if defined(IGNIS_ARCH_NEON)
#  include "arch/neon/neon.h"
#endif

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#  define IG_X86 1
#  if defined(_MSC_VER)
#    include <intrin.h>
static void ig_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    for (int i = 0; i < 4; i++) r[i] = (unsigned)v[i];
}
static unsigned long long ig_xgetbv0(void) { return _xgetbv(0); }
#  else
#    include <cpuid.h>
static void ig_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    r[0] = r[1] = r[2] = r[3] = 0;
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static unsigned long long ig_xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#  endif
#elif defined(__aarch64__) || defined(_M_ARM64)
#  define IG_ARM64 1
#  if defined(__linux__)
#    include <sys/auxv.h>
#    ifndef HWCAP_ASIMDDP
#      define HWCAP_ASIMDDP (1 << 20)
#    endif
#    ifndef HWCAP2_I8MM
#      define HWCAP2_I8MM (1 << 13)
#    endif
#  elif defined(__APPLE__)
#    include <sys/sysctl.h>
/* the sysctl hw.optional.arm.FEAT_<name>: 1 or 0; -1 when it does not exist (before macOS 12) */
static int ig_apple_feature(const char *name) {
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 ? v != 0 : -1;
}
#  endif
#endif

static uint32_t detect(void) {
    uint32_t f = 0;
#if defined(IG_X86)
    unsigned r[4];
    ig_cpuid(0, 0, r);
    unsigned max_leaf = r[0];
    ig_cpuid(1, 0, r);
    unsigned ecx1 = r[2];
    int osxsave = (ecx1 >> 27) & 1;
    unsigned long long xcr0 = osxsave ? ig_xgetbv0() : 0;
    /* The CPU may support an ISA the OS does not save state for: check XCR0 too. */
    int os_avx = (xcr0 & 0x6) == 0x6;
    int os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
    int os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);
    if (os_avx) {
        if ((ecx1 >> 28) & 1) f |= IG_CPU_AVX;
        if ((ecx1 >> 12) & 1) f |= IG_CPU_FMA;
        if ((ecx1 >> 29) & 1) f |= IG_CPU_F16C;
    }
    if (max_leaf >= 7) {
        ig_cpuid(7, 0, r);
        unsigned ebx7 = r[1], ecx7 = r[2], edx7 = r[3], max_sub = r[0];
        if (os_avx && ((ebx7 >> 5) & 1)) f |= IG_CPU_AVX2;
        if (os_avx512) {
            if ((ebx7 >> 16) & 1) f |= IG_CPU_AVX512F;
            if ((ebx7 >> 17) & 1) f |= IG_CPU_AVX512DQ;
            if ((ebx7 >> 30) & 1) f |= IG_CPU_AVX512BW;
            if ((ebx7 >> 31) & 1) f |= IG_CPU_AVX512VL;
            if ((ecx7 >> 11) & 1) f |= IG_CPU_AVX512_VNNI;
        }
        if (os_amx) {
            if ((edx7 >> 24) & 1) f |= IG_CPU_AMX_TILE;
            if ((edx7 >> 25) & 1) f |= IG_CPU_AMX_INT8;
            if ((edx7 >> 22) & 1) f |= IG_CPU_AMX_BF16;
        }
        if (max_sub >= 1) {
            ig_cpuid(7, 1, r);
            if (os_avx && ((r[0] >> 4) & 1)) f |= IG_CPU_AVX_VNNI;
            if (os_avx512 && ((r[0] >> 5) & 1)) f |= IG_CPU_AVX512_BF16;
        }
    }
#elif defined(IG_ARM64)
    f |= IG_CPU_NEON;           /* Advanced SIMD is part of every AArch64 CPU */
#  if defined(__linux__)
    /* what the kernel reports, so also what it lets user space run (and what qemu-user models) */
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) f |= IG_CPU_NEON_DOTPROD;
    if ((f & IG_CPU_NEON_DOTPROD) && (getauxval(AT_HWCAP2) & HWCAP2_I8MM)) f |= IG_CPU_NEON_I8MM;
#  elif defined(__APPLE__)
    /* every Apple silicon core has dotprod: macOS 11, without the FEAT_ sysctls, keeps it */
    if (ig_apple_feature("hw.optional.arm.FEAT_DotProd") != 0) f |= IG_CPU_NEON_DOTPROD;
    if ((f & IG_CPU_NEON_DOTPROD) && ig_apple_feature("hw.optional.arm.FEAT_I8MM") == 1)
        f |= IG_CPU_NEON_I8MM;
#  endif
#endif
    return f;
}

static uint32_t g_features;
static int g_detected;

uint32_t ig_cpu_features(void) {
    /* Benign race: every thread computes the same value. Python calls this once at import. */
    if (!g_detected) {
        g_features = detect();
        g_detected = 1;
    }
    return g_features;
}

static const char *const FEATURE_NAMES[IG_CPU_N_FEATURES] = {
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
    "neon", "neon_dotprod", "neon_i8mm",
};

const char *ig_cpu_feature_name(int bit) {
    return (bit >= 0 && bit < IG_CPU_N_FEATURES) ? FEATURE_NAMES[bit] : NULL;
}

/* ---- the tables, lowest level first ---- */
/* An ISA's tables exist when setup.py compiled its kernels (csrc/arch/) for this target. */
#define IG_X86_AVX512 (IG_CPU_AVX2 | IG_CPU_AVX512F | IG_CPU_AVX512BW | IG_CPU_AVX512DQ | \
                       IG_CPU_AVX512VL | IG_CPU_FMA | IG_CPU_F16C)

/* The row-wise and elementwise ops have no ISA versions but these: the portable loops are
 * memory-bound and the compiler vectorizes them already; rmsnorm's double sum fixes its order.
 * GEGLU's gelu (a polynomial exp per element, ignis.h) has an AVX-512 loop, and SiLU / SwiGLU
 * (ig_expf_f32 in double, ignis.h) AVX2 and AVX-512 loops, with the twin's bits
 * (arch/eltwise_avx512.c, arch/avx2.c). */
#define IG_ROW_KERNELS ig_rmsnorm_f32_ref, ig_rope_f32_ref, ig_eltwise_f32_ref
#define IG_ROW_KERNELS_AVX2 ig_rmsnorm_f32_ref, ig_rope_f32_ref, ig_eltwise_f32_avx2
#define IG_ROW_KERNELS_AVX512 ig_rmsnorm_f32_ref, ig_rope_f32_ref, ig_eltwise_f32_avx512

/* A table's matmuls, one per packing (ig_kernel_fns.wformat, indexed by IG_PACK_*): what a packing
 * quantizes its activations to is the same in every table, so it is written once, here. */
#define IG_WFORMATS(f32, bf16, q8, q4, x16)                                                   \
    {[IG_PACK_F32] = {IG_ACT_F32, f32}, [IG_PACK_BF16] = {IG_ACT_F32, bf16},                  \
     [IG_PACK_Q8] = {IG_ACT_Q8, q8}, [IG_PACK_Q4] = {IG_ACT_Q8, q4},                          \
     [IG_PACK_X16] = {IG_ACT_X16, x16}}

static const ig_kernel_table TABLES[] = {
    {"generic", 0, 0,
     {IG_WFORMATS(ig_matmul_f32_ref, ig_matmul_bf16_ref, ig_matmul_q8_ref, ig_matmul_q4_ref,
                  ig_matmul_x16_ref),
      ig_quantize_q8_rows_ref, ig_quantize_x16_rows_ref, ig_attention_f32_ref, IG_ROW_KERNELS}},
#if defined(IGNIS_ARCH_X86)
    {"avx2", IG_CPU_AVX | IG_CPU_AVX2 | IG_CPU_FMA | IG_CPU_F16C, 10,
     {IG_WFORMATS(ig_matmul_f32_avx2, ig_matmul_bf16_avx2, ig_matmul_q8_avx2, ig_matmul_q4_avx2,
                  ig_matmul_x16_avx2),
      ig_quantize_q8_rows_avx2, ig_quantize_x16_rows_avx2, ig_attention_f32_avx2, IG_ROW_KERNELS_AVX2}},
    {"avx512", IG_X86_AVX512, 20,
     {IG_WFORMATS(ig_matmul_f32_avx512, ig_matmul_bf16_avx512, ig_matmul_q8_avx2, ig_matmul_q4_avx2,
                  ig_matmul_x16_avx2),
      ig_quantize_q8_rows_avx512, ig_quantize_x16_rows_avx512, ig_attention_f32_avx512,
      IG_ROW_KERNELS_AVX512}},
    {"avx512_vnni", IG_X86_AVX512 | IG_CPU_AVX512_VNNI, 30,
     {IG_WFORMATS(ig_matmul_f32_avx512, ig_matmul_bf16_avx512, ig_matmul_q8_avx512vnni,
                  ig_matmul_q4_avx512vnni, ig_matmul_x16_avx512vnni),
      ig_quantize_q8_rows_avx512, ig_quantize_x16_rows_avx512, ig_attention_f32_avx512,
      IG_ROW_KERNELS_AVX512}},
#endif
#if defined(IGNIS_ARCH_NEON)
    /* the integer matmuls of all three are the generic table's bit for bit (arch/neon/neon.h) */
    {"neon", IG_CPU_NEON, 10,
     {IG_WFORMATS(ig_matmul_f32_neon, ig_matmul_bf16_neon, ig_matmul_q8_neon, ig_matmul_q4_neon,
                  ig_matmul_x16_neon),
      ig_quantize_q8_rows_neon, ig_quantize_x16_rows_neon, ig_attention_f32_neon, IG_ROW_KERNELS}},
    {"neon_dotprod", IG_CPU_NEON | IG_CPU_NEON_DOTPROD, 20,
     {IG_WFORMATS(ig_matmul_f32_neon, ig_matmul_bf16_neon, ig_matmul_q8_neon_dotprod,
                  ig_matmul_q4_neon_dotprod, ig_matmul_x16_neon_dotprod),
      ig_quantize_q8_rows_neon, ig_quantize_x16_rows_neon, ig_attention_f32_neon, IG_ROW_KERNELS}},
    {"neon_i8mm", IG_CPU_NEON | IG_CPU_NEON_DOTPROD | IG_CPU_NEON_I8MM, 30,
     {IG_WFORMATS(ig_matmul_f32_neon, ig_matmul_bf16_neon, ig_matmul_q8_neon_i8mm,
                  ig_matmul_q4_neon_i8mm, ig_matmul_x16_neon_i8mm),
      ig_quantize_q8_rows_neon, ig_quantize_x16_rows_neon, ig_attention_f32_neon, IG_ROW_KERNELS}},
#endif
};
#define N_TABLES ((int)(sizeof(TABLES) / sizeof(TABLES[0])))

int ig_kernel_table_count(void) { return N_TABLES; }

const ig_kernel_table *ig_kernel_table_at(int i) {
    return (i >= 0 && i < N_TABLES) ? &TABLES[i] : NULL;
}

const ig_kernel_table *ig_kernel_table_find(const char *name) {
    for (int i = 0; i < N_TABLES; i++)
        if (name && strcmp(TABLES[i].name, name) == 0) return &TABLES[i];
    return NULL;
}

int ig_kernel_table_eligible(const ig_kernel_table *t) {
    return t && (t->requires & ~ig_cpu_features()) == 0;
}

const ig_kernel_table *ig_kernel_table_best(void) {
    const ig_kernel_table *best = &TABLES[0];
    for (int i = 1; i < N_TABLES; i++)
        if (ig_kernel_table_eligible(&TABLES[i]) && TABLES[i].priority > best->priority)
            best = &TABLES[i];
    return best;
}

/* ---- kernel calls on the pool (threads.h): one job per call, its IG_FOR loop shared ---- */

typedef struct {
    const ig_kernel_fns *k;
    const ig_wformat *f;
    const ig_matmul_args *a;
    float *out;
    const float *x, *y, *w, *inv_freq;
    const void *k_cache, *v_cache;
    const int32_t *pos, *seq;
    float *scratch;
    int64_t ldo, ldx;
    int op, T, dim, n_heads, n_kv_heads, head_dim, max_ctx, kv_rows, window, kv_f16, n;
    float eps, theta, scale;
} call_t;

static void job_matmul(void *p) {
    const call_t *c = p;
    c->f->matmul(c->a, c->n);
}

void ig_call_matmul(const ig_wformat *f, const ig_matmul_args *a, int n_threads) {
    call_t c = {.f = f, .a = a, .n = n_threads};
    ig_parallel(n_threads, job_matmul, &c);
}

/* Several matmuls as one job, for the small projections of a decode step: a job costs its
 * publication, the workers' entry and the join, and three jobs for q, k and v cost three times
 * that for ~700 KB of weights. Their rows are cut into IG_ROWS_UNIT-row units, one loop over all of
 * them (ig_for_range: a thread takes long runs first); each run of a part's rows is one kernel call
 * on those rows alone (ig_alone). Every driver computes each row one way, whatever block or tile
 * or thread takes it (its parallel blocks are 32 rows, 16 on NEON, fewer in a paired decode on
 * several threads), and groups rows from row 0 in 4s, so a call on rows from a multiple of 32
 * gives each row the bits the whole call gives it. With `chain`, the parts are the passes of one
 * matmul over the same rows (a SwiGLU's gate, then its up projection reading the gate's dots):
 * each run of rows goes through every part in order. */
#define IG_ROWS_UNIT 32

typedef struct {
    const ig_wformat *f;
    const ig_matmul_args *a;      /* this piece's rows (ig_alone's context) */
} piece_t;

static void run_piece(void *p) {
    const piece_t *c = p;
    c->f->matmul(c->a, 1);
}

typedef struct {
    const ig_wformat *f;
    const ig_matmul_args *parts;
    int n_parts, packing, chain;
    int64_t first[IG_MAX_PARTS + 1];   /* the units before each part (chain: all start at 0) */
} matmuls_t;

/* rows [r0, r1) of the matmul a: the same call on fewer rows, its pointers moved to row r0 */
static void piece_rows(ig_matmul_args *s, const ig_matmul_args *a, int packing, int64_t r0,
                       int64_t r1) {
    *s = *a;
    s->w = (const unsigned char *)a->w + ig_packed_bytes(packing, r0, a->K, a->layout);
    if (a->w2) s->w2 = (const unsigned char *)a->w2 + ig_packed_bytes(packing, r0, a->K, a->layout2);
    s->out = a->out + r0;
    if (a->bias) s->bias = a->bias + r0;
    if (a->res) s->res = a->res + r0;
    if (a->gate) s->gate = a->gate + r0;
    s->N = (int)(r1 - r0);
}

static void job_matmuls(void *p) {
    const matmuls_t *c = p;
    ig_for_iter it = ig_for_begin(c->first[c->chain ? 1 : c->n_parts], 1);
    int64_t lo, hi;
    while (ig_for_range(&it, &lo, &hi))
        for (int i = 0; i < c->n_parts; i++) {
            const int64_t u0 = c->chain ? 0 : c->first[i], u1 = c->chain ? c->first[1] : c->first[i + 1];
            const int64_t a0 = lo > u0 ? lo : u0, a1 = hi < u1 ? hi : u1;
            if (a0 >= a1) continue;
            const int64_t N = c->parts[i].N, r1 = (a1 - u0) * IG_ROWS_UNIT;
            ig_matmul_args s;
            piece_rows(&s, &c->parts[i], c->packing, (a0 - u0) * IG_ROWS_UNIT, r1 < N ? r1 : N);
            piece_t piece = {c->f, &s};
            ig_alone(run_piece, &piece);
        }
}

void ig_call_matmuls(const ig_wformat *f, int packing, const ig_matmul_args *parts, int n_parts,
                     int chain, int n_threads) {
    if (n_parts > IG_MAX_PARTS) {      /* more than one job holds: each part (pass) on its own */
        for (int i = 0; i < n_parts; i++) ig_call_matmul(f, &parts[i], n_threads);
        return;
    }
    matmuls_t c = {.f = f, .parts = parts, .n_parts = n_parts, .packing = packing, .chain = chain};
    for (int i = 0; i < n_parts; i++)
        c.first[i + 1] = c.first[i] + (parts[i].N + IG_ROWS_UNIT - 1) / IG_ROWS_UNIT;
    ig_parallel(n_threads, job_matmuls, &c);
}

static void job_rmsnorm(void *p) {
    const call_t *c = p;
    c->k->rmsnorm_f32(c->out, c->x, c->w, c->T, c->dim, c->eps, c->n);
}

/* The row kernels never split a single row: one row runs without a job. */
void ig_call_rmsnorm(const ig_kernel_fns *k, float *out, const float *x, const float *w, int T,
                     int dim, float eps, int n_threads) {
    call_t c = {.k = k, .out = out, .x = x, .w = w, .T = T, .dim = dim, .eps = eps, .n = n_threads};
    ig_parallel(T > 1 ? n_threads : 1, job_rmsnorm, &c);
}

static void job_rope(void *p) {
    const call_t *c = p;
    c->k->rope_f32(c->out, c->ldo, c->x, c->ldx, c->pos, c->inv_freq, c->T, c->n_heads, c->head_dim,
                   c->theta, c->n);
}

void ig_call_rope(const ig_kernel_fns *k, float *out, int64_t ldo, const float *x, int64_t ldx,
                  const int32_t *pos, const float *inv_freq, int T, int n_heads, int head_dim,
                  float theta, int n_threads) {
    call_t c = {.k = k, .out = out, .ldo = ldo, .x = x, .ldx = ldx, .pos = pos, .inv_freq = inv_freq,
                .T = T, .n_heads = n_heads, .head_dim = head_dim, .theta = theta, .n = n_threads};
    ig_parallel(T > 1 ? n_threads : 1, job_rope, &c);
}

static void job_eltwise(void *p) {
    const call_t *c = p;
    c->k->eltwise_f32(c->out, c->x, c->y, c->op, c->T, c->dim, c->n);
}

void ig_call_eltwise(const ig_kernel_fns *k, float *out, const float *x, const float *y, int op,
                     int T, int dim, int n_threads) {
    call_t c = {.k = k, .out = out, .x = x, .y = y, .op = op, .T = T, .dim = dim, .n = n_threads};
    ig_parallel(T > 1 ? n_threads : 1, job_eltwise, &c);
}

static void job_attention(void *p) {
    const call_t *c = p;
    c->k->attention_f32(c->out, c->ldo, c->x, c->ldx, c->k_cache, c->v_cache, c->kv_f16, c->pos,
                        c->seq, c->scratch, c->T, c->n_heads, c->n_kv_heads, c->head_dim,
                        c->max_ctx, c->kv_rows, c->scale, c->window, c->n);
}

ig_status ig_call_attention(const ig_kernel_fns *k, float *out, int64_t ldo, const float *q,
                            int64_t ldq, const void *k_cache, const void *v_cache, int kv_f16,
                            const int32_t *pos, const int32_t *seq, float *scratch, int T, int n_heads,
                            int n_kv_heads, int head_dim, int max_ctx, int kv_rows, float scale,
                            int window, int n_threads) {
    /* the caller always takes part in its job: its scratch must exist (a worker's may not);
     * heads larger than the tile's take the untiled path, which needs none */
    if (head_dim <= IG_ATTN_TILE_MAX_HD && !ig_thread_scratch(IG_ATTN_SCRATCH_BYTES)) return IG_ERR_NOMEM;
    call_t c = {.k = k, .out = out, .ldo = ldo, .x = q, .ldx = ldq, .k_cache = k_cache,
                .v_cache = v_cache, .kv_f16 = kv_f16, .pos = pos, .seq = seq, .scratch = scratch,
                .T = T, .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                .max_ctx = max_ctx, .kv_rows = kv_rows, .scale = scale, .window = window,
                .n = n_threads};
    ig_parallel(n_threads, job_attention, &c);
    return IG_OK;
}

/* ---- threads ---- */
#ifdef _OPENMP
int ig_openmp_enabled(void) { return 1; }
#else
int ig_openmp_enabled(void) { return 0; }
#endif
int ig_max_threads(void) { return ig_cpus_available(); }
