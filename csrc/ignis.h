/* ignis.h — the whole C ABI of the ignis core.
 *
 * Python (ignis/_core.pyx) talks to C only through what this header declares. Kernels follow one
 * convention: output first, const inputs next, sizes last, a shape comment on every pointer.
 * Nothing here allocates on a hot path or exits the process; failures are status codes.
 */
#ifndef IGNIS_H
#define IGNIS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "threads.h"   /* IG_FOR: how every kernel's parallel loop is written */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------------------------- */
typedef enum {
    IG_OK = 0,
    IG_ERR_ARG = 1,          /* an argument is out of range */
    IG_ERR_UNSUPPORTED = 2,  /* the CPU or build lacks what was asked for */
    IG_ERR_NOMEM = 3,        /* an allocation failed: at model creation, or a thread's attention
                              * scratch at its first step (ig_call_attention) */
    IG_ERR_TAPE = 4,         /* an instruction tape is malformed (names the instruction) */
} ig_status;

/* ---- block-quantized int8 weights (q8): 32 weights share one f32 scale, w[i] = d * qs[i] ------ */
#define IG_QK 32
typedef struct {
    float  d;           /* scale: max|w| / 127 over the block */
    int8_t qs[IG_QK];   /* in -127..127 (never -128: the sign tricks of the integer dot rely on it) */
} ig_block_q8;          /* 36 bytes */

/* Weights as the q8 matmuls read them ("packed q8"): the same blocks (scale d, 32 integers in
 * -127..127), regrouped so a kernel streams each weight once, in order, 64 bytes at a time. Rows
 * go in groups of 4 (the last group padded with zero rows). A group holds, for K/32 = nb blocks:
 *   d[nb][4]      IEEE half scales, block-major (the 4 rows' scales of block b side by side),
 *                 then zero padding to a multiple of 64 bytes (8.5 bits per weight in all),
 *   qs[nb][4][32] the integers plus 128, as u8 (1..255): a VNNI u8 x s8 dot takes them directly,
 *                 and 128 * sum(x) is subtracted back (the activation side's correction).
 * Groups follow each other; every group is IG_Q8P_GROUP_BYTES(nb) long. */
#define IG_Q8P_ROWS 4
#define IG_Q8P_SCALE_BYTES(nb) (((int64_t)(nb) * 8 + 63) / 64 * 64)
#define IG_Q8P_GROUP_BYTES(nb) (IG_Q8P_SCALE_BYTES(nb) + (int64_t)(nb) * 128)
#define IG_Q8P_BYTES(N, K) (((int64_t)(N) + 3) / 4 * IG_Q8P_GROUP_BYTES((K) / IG_QK))

/* The q8 matmul: out[t, n] = sum_b d_x[t,b] * d_w[n,b] * sum_i qx[t,b,i] * qw[n,b,i], activations
 * quantized the same way, per block of 32, by ig_quantize_q8_rows_ref. */

/* ---- 4-bit weights (q4): 32 weights share one half scale, w = d * k with k in -8..7 --------------
 * Packed like q8 (groups of 4 rows, last group zero-padded), each group holding for nb blocks:
 *   d[nb][4]      IEEE half scales, block-major, then zero padding to a multiple of 64 bytes,
 *   qs[nb][4][16] per row 16 bytes: byte i = (k[i] + 8) | (k[i + 16] + 8) << 4.
 * The matmul takes the same quantized activations as q8 (ig_quantize_q8_rows_ref) and the same
 * epilogues; out[t, n] = sum_b d_x[t,b] * d_w[n,b] * sum_i qx[t,b,i] * k[n,b,i]. */
#define IG_Q4P_SCALE_BYTES(nb) (((int64_t)(nb) * 8 + 63) / 64 * 64)
#define IG_Q4P_GROUP_BYTES(nb) (IG_Q4P_SCALE_BYTES(nb) + (int64_t)(nb) * 64)
#define IG_Q4P_BYTES(N, K) (((int64_t)(N) + 3) / 4 * IG_Q4P_GROUP_BYTES((K) / IG_QK))

/* ---- a GGUF file's own blocks, read with 16-bit activations ("x16") ---------------------------
 * Weights keep the exact values of the GGUF blocks they came from; activations are quantized per
 * block of 32 to 16 bits (a = rint(x * (32512 / max|x|)), d = max|x| / 32512) and split
 * a = 256 * hi + lo with hi in -127..127 and lo in -128..127, so two VNNI dot products (hi and lo)
 * give sum(w * a) exactly in int32. The activation error is 2^-16 of the block's largest value
 * (q8's is 2^-8). Four weight layouts, each in groups of 4 rows like packed q8 (the last group
 * zero-padded); every region of a group below is padded once, at its end, to a multiple of 64 bytes:
 *   IG_WX_Q8  packed q8 as above (GGUF Q8_0: d and the integers, bit for bit; GGUF IQ4_NL: d and
 *             its 4-bit indices' table values, -127..113, as the integers),
 *   IG_WX_Q5_0 GGUF Q5_0, and Q4_0 stored as u = k + 16 (k in -8..7, so the fifth bit is the
 *             sign): w = d * (u - 16), u in 0..31. Per group the half scales d[nb][4], the fifth bits (per block two 64-bit masks: bit 16r+i of the first
 *             is bit 4 of row r's u[i], of the second bit 4 of u[16+i]), then the low four bits
 *             like q4 (per block and row 16 bytes: byte i = u[i] & 15 | (u[i+16] & 15) << 4),
 *   IG_WX_Q6K GGUF Q6_K (w = d * sc * q over sub-blocks of 16, q in -32..31, u = q + 32): per
 *             group the super-block scales d[nb/8][4] as f32, the sub-block scales sc[nb][4][2] as
 *             int8, the two high bits of u as four 64-bit masks per block (bit 16r+i: bit 4 of the
 *             value in row r's low nibble i, bit 5 of it, then the same two for the high nibbles),
 *             then the low four bits as nibbles, per block and row 16 bytes, half by half: byte
 *             i < 8 holds u[i] and u[i+8], byte 8+i holds u[16+i] and u[24+i] (low nibble first),
 *             so a 4-byte lane never mixes the two halves' scales. d * sc is exact in f32.
 *   IG_WX_Q4K GGUF Q4_K (w = d * sc * q - dmin * m over sub-blocks of 32, q in 0..15): per group
 *             per super-block d[4] then dmin[4] as f32 (32 bytes), per block sc[4] then m[4] as
 *             int8 (8 bytes), then the integers as nibbles like q4 (per block and row 16 bytes:
 *             byte i = q[i] | q[i+16] << 4). The offsets take the activation block's f32 sum:
 *             dmin * m * xsum.
 *   IG_WX_Q4_1 GGUF Q4_1 (w = d * q + m per block of 32, q in 0..15, d and m IEEE half): per group
 *             the half scales d[nb][4] like Q5_0, the half offsets m[nb][4] laid out the same way,
 *             then the nibbles like Q4_K. The offsets take the activation block's f32 sum: m * xsum.
 *   IG_WX_Q5_1 GGUF Q5_1 (the same with a fifth bit, q in 0..31): Q4_1's regions with Q5_0's two
 *             64-bit masks per block between the offsets and the nibbles.
 *   IG_WX_Q5K GGUF Q5_K (Q4_K with a fifth bit, q in 0..31): Q4_K's regions with Q5_0's two 64-bit
 *             masks per block between the block scales and the nibbles.
 *   IG_WX_Q3K GGUF Q3_K (w = d * sc * q over sub-blocks of 16, q in -4..3, u = q + 4): Q6_K's
 *             super-block and sub-block scales (sc - 32 as int8), one bit of u less: its bit 2 as
 *             two 64-bit masks per block (bit 16r+i: the value in row r's low crumb i, then the
 *             high), its low two bits as crumbs, per pair of blocks and row 16 bytes (64 per pair):
 *             byte i holds the first block's u[e] and u[e+8] (bits 0-1, 2-3; e = i < 8 ? i : i + 8,
 *             Q6_K's order) and the second block's the same way in bits 4-7.
 *   IG_WX_Q2K GGUF Q2_K (w = d * sc * q - dmin * m over sub-blocks of 16, q in 0..3, sc and m in
 *             0..15): per group per super-block d[4] then dmin[4] as f32 (Q4_K's region), per block
 *             and row the file's bytes sc | m << 4 of its two halves (8 bytes), then the integers as
 *             crumbs like Q3_K's. The offsets take each half's activation sum as quantized:
 *             dmin * m * d_x * s[half].
 * Bits per weight: 8.5 for Q8_0, 5.5 for Q5_0, 5.0 for Q4_1 and 6.0 for Q5_1 (the file's own),
 * 6.63 for Q6_K, 4.75 for Q4_K, 5.75 for Q5_K, 3.63 for Q3_K and 2.75 for Q2_K (the file's: 6.56,
 * 4.5, 5.5, 3.44, 2.63), 5.5 for Q4_0 (4.5), 8.5 for IQ4_NL (4.5; exact in the Q8_0 layout). */
typedef struct {
    float   d;
    int32_t s[2];       /* sum of a over each half (16 values): the kernels' offset corrections */
    int8_t  hi[IG_QK];
    int8_t  lo[IG_QK];
} ig_block_x16;         /* 76 bytes */

enum { IG_WX_Q8 = 0, IG_WX_Q5_0 = 1, IG_WX_Q6K = 2, IG_WX_Q4K = 3, IG_WX_Q4_1 = 4, IG_WX_Q5_1 = 5,
       IG_WX_Q5K = 6, IG_WX_Q3K = 7, IG_WX_Q2K = 8, IG_WX_COUNT = 9 };
#define IG_X16_MAX 32512.0f
#define IG_Q5P_MASK_BYTES(nb) (((int64_t)(nb) * 16 + 63) / 64 * 64)
#define IG_Q5P_GROUP_BYTES(nb) (IG_Q8P_SCALE_BYTES(nb) + IG_Q5P_MASK_BYTES(nb) + (int64_t)(nb) * 64)
#define IG_Q6KP_D_BYTES(nb) ((((int64_t)(nb) + 7) / 8 * 16 + 63) / 64 * 64)
#define IG_Q6KP_MASK_BYTES(nb) (((int64_t)(nb) * 32 + 63) / 64 * 64)
#define IG_Q6KP_GROUP_BYTES(nb) (IG_Q6KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + IG_Q6KP_MASK_BYTES(nb) + \
                                 (int64_t)(nb) * 64)
#define IG_Q4KP_D_BYTES(nb) ((((int64_t)(nb) + 7) / 8 * 32 + 63) / 64 * 64)
#define IG_Q4KP_GROUP_BYTES(nb) (IG_Q4KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + (int64_t)(nb) * 64)
#define IG_Q41P_GROUP_BYTES(nb) (2 * IG_Q8P_SCALE_BYTES(nb) + (int64_t)(nb) * 64)
#define IG_Q51P_GROUP_BYTES(nb) (IG_Q41P_GROUP_BYTES(nb) + IG_Q5P_MASK_BYTES(nb))
#define IG_Q5KP_GROUP_BYTES(nb) (IG_Q4KP_GROUP_BYTES(nb) + IG_Q5P_MASK_BYTES(nb))
#define IG_Q3KP_GROUP_BYTES(nb) (IG_Q6KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + IG_Q5P_MASK_BYTES(nb) + \
                                 (int64_t)(nb) * 32)
#define IG_Q2KP_GROUP_BYTES(nb) (IG_Q4KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + (int64_t)(nb) * 32)

/* ---- packed weights: one matmul call shape, and per kernel table the traits of each packing ---- */
/* A packing is a form the matmuls read a weight in. Its id indexes every kernel table's wformat
 * array, and ignis/formats' Packing.c_id holds the same number (tests/test_formats.py holds the
 * Python sizes to ig_packed_bytes). A weight has one packing; its f32 rows stay available besides
 * (gathers and biases read them). */
enum {
    IG_PACK_F32 = 0,    /* (N, K) f32 rows: the model's own weights (exact; the default) */
    IG_PACK_BF16 = 1,   /* (N, K) bf16 bits (uint16, the top half of an f32): products are exact in
                         * f32, so the result is the f32 matmul's on the bf16-rounded weights */
    IG_PACK_Q8 = 2,     /* packed q8, IG_Q8P_BYTES(N, K) */
    IG_PACK_Q4 = 3,     /* packed q4, IG_Q4P_BYTES(N, K) */
    IG_PACK_X16 = 4,    /* a GGUF file's blocks in one of the IG_WX_* layouts (its `layout`) */
    IG_PACK_COUNT = 5
};

/* One weight as the matmuls read it. */
typedef struct {
    int32_t     packing;  /* IG_PACK_* */
    int32_t     layout;   /* IG_PACK_X16: its IG_WX_* layout; 0 for the others */
    const void *w;        /* the packed bytes, ig_packed_bytes(packing, N, K, layout) of them */
} ig_packed_weight;

/* Bytes of an (N, K) matrix in a packing (and layout): the size macros above. -1 for an unknown
 * packing or layout, or K not a multiple of ig_packed_block. */
int64_t     ig_packed_bytes(int packing, int64_t N, int64_t K, int layout);
/* What K must be a multiple of: 1 (f32, bf16), 32 (IG_QK) or 256 (the K-quant layouts); 0 for an
 * unknown packing or layout. */
int         ig_packed_block(int packing, int layout);
const char *ig_packing_name(int packing);   /* "f32", "bf16", "q8", "q4", "x16"; NULL past the end */

/* The activations a packing's matmul reads (ig_matmul_args.x). */
enum {
    IG_ACT_F32 = 0,     /* the f32 rows themselves: (T, ldx) */
    IG_ACT_Q8 = 1,      /* (T, K/32) ig_block_q8, made by quantize_q8_rows */
    IG_ACT_X16 = 2,     /* (T, K/32) ig_block_x16 and xsum, made by quantize_x16_rows */
    IG_ACT_COUNT = 3
};

/* Every matmul, whatever the packing: out[t, n] = dot(x[t, :K], w[n, :]) (+ bias[n]) (+ res[t, n]),
 * or with w2 the SwiGLU epilogue silu(dot(x[t], w[n])) * dot(x[t], w2[n]) (bias and res NULL then).
 * Rows of out and res are ldo and ldr floats apart (and of x, as f32 rows, ldx), so a packed q|k|v
 * output is three calls into one buffer. The block packings dot integer blocks: out[t, n] =
 * sum_b d_x[t,b] * d_w[n,b] * sum_i qx[t,b,i] * qw[n,b,i] (x16: plus its layouts' offsets times
 * xsum). */
typedef struct {
    float       *out;     /* (T, ldo): columns [0, N) are written */
    const void  *x;       /* as the packing's act says: f32 (T, ldx), columns [0, K) read, or
                           * (T, K/32) ig_block_q8 / ig_block_x16 */
    const float *xsum;    /* IG_ACT_X16: (T, K/32) f32 sum of each activation block; else NULL */
    const void  *w;       /* (N, K) in the packing */
    const void  *w2;      /* the SwiGLU up projection in the same packing, or NULL */
    const float *bias;    /* (N,) or NULL */
    const float *res;     /* (T, ldr) residual, or NULL; may equal out */
    const float *gate;    /* the SwiGLU in two passes: (T, ldo) the gate's dots (may equal out),
                           * out = silu(gate) * dot(x, w), w the up projection; or NULL */
    int64_t ldo, ldx, ldr;
    int T, N, K;          /* K a multiple of ig_packed_block */
    int layout, layout2;  /* IG_PACK_X16: the IG_WX_* layouts of w and w2 (they may differ) */
} ig_matmul_args;

typedef void (*ig_matmul_fn)(const ig_matmul_args *a, int n_threads);

/* A packing's entry in a kernel table: the activations its matmul takes and the matmul. */
typedef struct {
    int          act;     /* IG_ACT_* */
    ig_matmul_fn matmul;  /* parallel over blocks of output columns (weight rows) only */
} ig_wformat;

/* ---- CPU features (detected once, see dispatch.c) ----------------------------------------- */
enum {
    IG_CPU_AVX         = 1u << 0,
    IG_CPU_AVX2        = 1u << 1,
    IG_CPU_FMA         = 1u << 2,
    IG_CPU_F16C        = 1u << 3,
    IG_CPU_AVX512F     = 1u << 4,
    IG_CPU_AVX512BW    = 1u << 5,
    IG_CPU_AVX512DQ    = 1u << 6,
    IG_CPU_AVX512VL    = 1u << 7,
    IG_CPU_AVX512_VNNI = 1u << 8,
    IG_CPU_AVX512_BF16 = 1u << 9,
    IG_CPU_AVX_VNNI    = 1u << 10,
    IG_CPU_AMX_TILE    = 1u << 11,
    IG_CPU_AMX_INT8    = 1u << 12,
    IG_CPU_AMX_BF16    = 1u << 13,
    IG_CPU_NEON        = 1u << 14,
    IG_CPU_NEON_DOTPROD = 1u << 15,
    IG_CPU_NEON_I8MM   = 1u << 16,
};
#define IG_CPU_N_FEATURES 17

uint32_t    ig_cpu_features(void);              /* bitmask of IG_CPU_*; OS support checked (XCR0) */
const char *ig_cpu_feature_name(int bit);       /* "avx2", ...; NULL past the end */

/* ---- kernel tables ------------------------------------------------------------------------ */
/* One table per ISA level. A table is eligible only when every feature in `requires` is present.
 * Every op of the executor runs through these slots. A new kernel: its _ref below (csrc/ops/), a
 * slot here, the slot filled in every table in dispatch.c (NULL is not allowed: a table without an
 * ISA version points at the portable one), a wrapper in ignis/_core.pyx, a test in
 * tests/test_kernels.py. Kernels thread over rows, heads or weight rows, never inside a sum, so
 * the thread count changes no bit. */
typedef struct {
    /* per packing (IG_PACK_*), indexed by its id: the activations its matmul reads and the matmul */
    ig_wformat wformat[IG_PACK_COUNT];
    /* see ig_quantize_q8_rows_ref: every table's version gives the same bytes */
    void    (*quantize_q8_rows)(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K);
    /* see ig_quantize_x16_rows_ref: every table's version gives the same bytes and sums */
    void    (*quantize_x16_rows)(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                                 int K);
    /* see ig_attention_f32_ref */
    void    (*attention_f32)(float *out, int64_t ldo, const float *q, int64_t ldq,
                             const void *k_cache, const void *v_cache, int kv_f16,
                             const int32_t *pos, const int32_t *seq, float *scratch, int T,
                             int n_heads, int n_kv_heads, int head_dim, int max_ctx, int kv_rows,
                             float scale, int window, int n_threads);
    /* see ig_rmsnorm_f32_ref */
    void    (*rmsnorm_f32)(float *out, const float *x, const float *w, int T, int dim, float eps,
                           int n_threads);
    /* see ig_rope_f32_ref */
    void    (*rope_f32)(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos,
                        const float *inv_freq, int T, int n_heads, int head_dim, float theta,
                        int n_threads);
    /* see ig_eltwise_f32_ref */
    void    (*eltwise_f32)(float *out, const float *x, const float *y, int op, int T, int dim,
                           int n_threads);
} ig_kernel_fns;

typedef struct {
    const char   *name;      /* "generic", "avx2", "avx512", "avx512_vnni", "neon", ... */
    uint32_t      requires;  /* IG_CPU_* bitmask */
    int           priority;  /* higher wins among eligible tables */
    ig_kernel_fns fns;
} ig_kernel_table;

int                    ig_kernel_table_count(void);
const ig_kernel_table *ig_kernel_table_at(int i);          /* NULL when out of range */
const ig_kernel_table *ig_kernel_table_find(const char *name);
int                    ig_kernel_table_eligible(const ig_kernel_table *t);
const ig_kernel_table *ig_kernel_table_best(void);         /* highest-priority eligible table */

/* ---- threads (threads.h: the pool, IG_FOR) ------------------------------------------------- */
int ig_openmp_enabled(void);     /* 1 when built with OpenMP (kernels not yet on IG_FOR use it) */
int ig_max_threads(void);        /* CPUs this process may run on (affinity mask) */

/* A kernel slot called on n_threads of the pool: one job, the kernel's IG_FOR loop shared by
 * its threads (the executor and _core's entry points call kernels through these). */
void ig_call_matmul(const ig_wformat *f, const ig_matmul_args *a, int n_threads);
/* n_parts (<= IG_MAX_PARTS) matmuls of one packing and table entry as one job over all their rows,
 * each row with the bits ig_call_matmul gives it (dispatch.c). chain: the parts are passes over the
 * same rows, run in order on each piece (a SwiGLU's gate, then the up projection reading it). */
#define IG_MAX_PARTS 4
void ig_call_matmuls(const ig_wformat *f, int packing, const ig_matmul_args *parts, int n_parts,
                     int chain, int n_threads);
void ig_call_rmsnorm(const ig_kernel_fns *k, float *out, const float *x, const float *w, int T,
                     int dim, float eps, int n_threads);
void ig_call_rope(const ig_kernel_fns *k, float *out, int64_t ldo, const float *x, int64_t ldx,
                  const int32_t *pos, const float *inv_freq, int T, int n_heads, int head_dim,
                  float theta, int n_threads);
void ig_call_eltwise(const ig_kernel_fns *k, float *out, const float *x, const float *y, int op,
                     int T, int dim, int n_threads);
/* IG_ERR_NOMEM (and nothing done) when the calling thread's attention scratch cannot be made */
ig_status ig_call_attention(const ig_kernel_fns *k, float *out, int64_t ldo, const float *q,
                            int64_t ldq, const void *k_cache, const void *v_cache, int kv_f16,
                            const int32_t *pos, const int32_t *seq, float *scratch, int T, int n_heads,
                            int n_kv_heads, int head_dim, int max_ctx, int kv_rows, float scale,
                            int window, int n_threads);

/* ---- portable reference kernels (csrc/ops/) ----------------------------------------------- */
/* the portable matmul of each packing (ig_matmul_args, its x in the packing's act form) */
void    ig_matmul_f32_ref(const ig_matmul_args *a, int n_threads);
void    ig_matmul_bf16_ref(const ig_matmul_args *a, int n_threads);
void    ig_matmul_q8_ref(const ig_matmul_args *a, int n_threads);
void    ig_matmul_q4_ref(const ig_matmul_args *a, int n_threads);
void    ig_matmul_x16_ref(const ig_matmul_args *a, int n_threads);
/* activation rows to x16 blocks and their f32 block sums: out:(T, K/32) xsum:(T, K/32) */
void    ig_quantize_x16_rows_ref(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                                 int K);
/* quantize T rows of K floats (K a multiple of 32): out:(T, K/32) x:(T, ldx) */
void    ig_quantize_q8_rows_ref(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K);
/* The activation quantizers' block maximum, max |v[i]| over 32 floats compared as bits: numbers
 * come out as with fmaxf, and a NaN anywhere wins (the one with the largest bits), so it reaches
 * the block's scale and the matmul's output as it would in f32. Every table's quantizer takes the
 * same maximum, and gives a block all-zero integers when its inverse scale (127 or 32512 / max) is
 * 0 or not finite: a zero or denormal maximum, one so small the division overflows, an inf or a
 * NaN in the block. */
static inline float ig_block_amax(const float *v) {   // v:(32,)
    uint32_t m = 0;
    for (int i = 0; i < IG_QK; i++) {
        uint32_t u;
        memcpy(&u, v + i, sizeof u);
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    float amax;
    memcpy(&amax, &m, sizeof amax);
    return amax;
}

/* Row-wise and attention kernels (portable; every row or head is independent). The row kernels
 * run on n_threads only for at least IG_ROWS_PAR_MIN elements: below, waking the threads costs
 * more than the work. */
#define IG_MAX_HEAD_DIM 1024   /* rope and f16 attention keep a head's worth of floats on the stack */
#define IG_ROWS_PAR_MIN 32768
/* out = x / sqrt(mean(x^2) + eps) (* w); out,x:(T, dim) w:(dim,) or NULL; out may equal x.
 * The sum of squares in double, in index order. */
void ig_rmsnorm_f32_ref(float *out, const float *x, const float *w, int T, int dim, float eps,
                        int n_threads);
/* NEOX rotary embedding of the first n_heads*head_dim columns of each row; out:(T, ldo)
 * x:(T, ldx) pos:(T,) inv_freq:(head_dim/2,) or NULL; out may equal x (in place), other columns of
 * out are not written. Pair j turns by pos*inv_freq[j] in f32, as transformers computes it; the
 * table is data from the config (ignis/models/rope.py: rope scalings), NULL means plain RoPE,
 * theta^(-2j/d) rounded as that module's plain table (the power in double, rounded to f32). */
void ig_rope_f32_ref(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos,
                     const float *inv_freq, int T, int n_heads, int head_dim, float theta,
                     int n_threads);
/* Elementwise ops, selected by op: out:(T, dim) x:(T, dim) y:(T, dim), (dim,) for IG_EW_SCALE (w
 * broadcast over rows), unused (NULL) for IG_EW_SILU; out may equal x or y. */
enum {
    IG_EW_ADD = 0,      /* x + y */
    IG_EW_MUL = 1,      /* x * y */
    IG_EW_SILU = 2,     /* silu(x) */
    IG_EW_SWIGLU = 3,   /* silu(x) * y */
    IG_EW_SCALE = 4,    /* x * w[i], w = y */
    IG_EW_GEGLU = 5,    /* gelu_tanh(x) * y */
};
void ig_eltwise_f32_ref(float *out, const float *x, const float *y, int op, int T, int dim,
                        int n_threads);
/* Causal GQA attention of T query rows against a layer's cache: row t reads the rows
 * 0..pos[t] (already written) of its sequence's slot seq[t] (seq NULL: every row is slot 0), or
 * with window > 0 only the rows pos[t]-window+1..pos[t] (transformers' sliding window); scores are
 * q.k * scale (1/sqrt(head_dim) for most models, Gemma's query_pre_attn_scalar^-0.5).
 * out:(T, ldo) q:(T, ldq) k_cache,v_cache: per slot kv_rows rows of n_kv_heads*head_dim, f32 or
 * (kv_f16) IEEE half stored as uint16, position p at row p % kv_rows (kv_rows, a multiple of
 * IG_KV_BLOCK: max_ctx rounded up, every position; or a ring holding at least each row's
 * window); v_cache row-major (n_seq, kv_rows, n_kv_heads*head_dim), k_cache in blocks of
 * IG_KV_BLOCK rows stored transposed (ig_kcache_at); pos,seq:(T,) scratch:(n_heads, max_ctx) one
 * score row per head (no [T, T] buffer), read only past head_dim 256. Parallel over tiles of
 * query rows x the heads of a KV head (ops/attention_tmpl.h); a row's bits do not depend on its
 * tile, the thread count, or a ring, while the cache holds finite values (the executor's f16
 * cache saturates at +-65504; a tile weighs the value rows a lane does not read by 0). */
/* The key cache's layout: the rows of a slot in blocks of IG_KV_BLOCK, each block a
 * (n_kv_heads*head_dim, IG_KV_BLOCK) matrix, so one KV head's part of a block is head_dim x 16
 * contiguous elements, position fastest: decode reads 16 keys' element d as one vector, prefill
 * broadcasts single elements; neither transposes. The value cache stays row-major. */
#define IG_KV_BLOCK 16
/* the largest context: int32 positions, rows rounded up to whole blocks, and the attention's
 * look-ahead of up to 8 blocks past a row still an int (runtime/engine.py MAX_CTX says the same) */
#define IG_MAX_CTX (INT32_MAX - 8 * IG_KV_BLOCK)
static inline size_t ig_kcache_at(int64_t seq, int64_t row, int64_t col, int64_t kv_rows,
                                  int64_t width) {     /* element (row, col) of slot seq */
    return (size_t)((seq * kv_rows + row / IG_KV_BLOCK * IG_KV_BLOCK) * width +
                    col * IG_KV_BLOCK + row % IG_KV_BLOCK);
}
/* The tiled attention path's working set per thread (a tile's queries and outputs, its lanes'
 * state, a block's key and value rows: ops/attention_tmpl.h), in ig_thread_scratch: ~105 KiB, too
 * much for a thread's stack. A thread that cannot have it takes no tiles (the job's other threads
 * do them); ig_call_attention makes the caller's first, so a call through it is never short. */
#define IG_ATTN_TILE_MAX_HD 256    /* larger heads take the untiled path, which needs no scratch */
#define IG_ATTN_SCRATCH_BYTES ((16384 + (16 + 3) * 128 + 2 * 16 * IG_ATTN_TILE_MAX_HD) * sizeof(float))
void ig_attention_f32_ref(float *out, int64_t ldo, const float *q, int64_t ldq, const void *k_cache,
                          const void *v_cache, int kv_f16, const int32_t *pos, const int32_t *seq,
                          float *scratch, int T, int n_heads, int n_kv_heads, int head_dim,
                          int max_ctx, int kv_rows, float scale, int window, int n_threads);
/* IEEE half <-> single, round to nearest even (portable bit manipulation, no F16C needed) */
uint16_t ig_f32_to_f16(float f);
float    ig_f16_to_f32(uint16_t h);
void     ig_f32_to_f16_row(uint16_t *out, const float *x, int64_t n);     /* out,x:(n,) */
/* exp(x) in float with the bits of glibc's expf on x86-64 with FMA and AVX2 (glibc 2.28 on, whose
 * expf is Arm's optimized-routines algorithm; the reduction, table, cubic and which steps are
 * fused are that algorithm's, so the bits agree):
 *   x * 32/ln2 = n + f in double, n the nearest integer, |f| <= 1/2 (one rounding: an fma);
 *   exp(x) = 2^(n >> 5) * 2^((n & 31)/32) * 2^(f/32), the middle factor from a 32-entry table and
 *   the exponent 2^(n >> 5) added to its bits; 2^(f/32) ~ 1 + c2 f + c1 f^2 + c0 f^3, one rounding
 *   to float at the end.
 * SiLU used libm's expf before this, and these are its bits (all 2^32 floats were compared once,
 * RESULTS.md; tests/test_kernels.py samples them), now the same on every platform and kernel
 * table: the AVX-512 and AVX2 tables run it 8 and 4 lanes of double at a time. */
extern const uint64_t ig_expf_tab[32];   /* bits of 2^(i/32) - (i << 47) (ops/eltwise.c) */
#define IG_EXPF_INVLN2N 0x1.71547652b82fep+5     /* 32 / ln 2 */
#define IG_EXPF_SHIFT   0x1.8p+52                /* adding it rounds to an integer in the low bits */
#define IG_EXPF_C0      0x1.c6af84b912394p-20    /* the cubic's coefficients, f^3 */
#define IG_EXPF_C1      0x1.ebfce50fac4f3p-13    /* f^2 */
#define IG_EXPF_C2      0x1.62e42ff0c52d6p-6     /* f */
/* exp(x) where |x| >= 88 (bits: x's) and the normal steps would not give it: 1 with *e set for
 * NaN (quieted), +-inf (inf, 0), past log(FLT_MAX) (inf), below log(2^-150) (0) and up to about
 * log(2^-149.4) (the smallest subnormal); 0 for the rest, which the normal steps compute */
static inline int ig_expf_edge(float x, uint32_t bits, float *e) {
    if (bits == 0xff800000u) *e = 0.0f;
    else if ((bits >> 20 & 0x7ff) >= 0x7f8) *e = x + x;
    else if (x > 0x1.62e42ep6f) *e = INFINITY;
    else if (x < -0x1.9fe368p6f) *e = 0.0f;
    else if (x < -0x1.9d1d9ep6f) *e = 0x1p-149f;
    else return 0;
    return 1;
}
static inline float ig_expf_f32(float x) {
    uint32_t bits;
    float e;
    memcpy(&bits, &x, sizeof bits);
    if ((bits >> 20 & 0x7ff) >= 0x42b && ig_expf_edge(x, bits, &e)) return e;
    const double n_shifted = fma(IG_EXPF_INVLN2N, (double)x, IG_EXPF_SHIFT);
    uint64_t n;                                   /* n in the low bits */
    memcpy(&n, &n_shifted, sizeof n);
    const double f = fma(IG_EXPF_INVLN2N, (double)x, -(n_shifted - IG_EXPF_SHIFT));
    const uint64_t scale_bits = ig_expf_tab[n & 31] + (n << 47);
    double scale;                                 /* 2^(n/32) */
    memcpy(&scale, &scale_bits, sizeof scale);
    const double cubic = fma(fma(f, IG_EXPF_C0, IG_EXPF_C1), f * f, fma(f, IG_EXPF_C2, 1.0));
    return (float)(cubic * scale);
}
/* silu(x) = x / (1 + exp(-x)) */
static inline float ig_silu_f32(float x) { return x / (1.0f + ig_expf_f32(-x)); }
/* gelu with the tanh approximation, as torch's gelu(approximate="tanh") (gelu_pytorch_tanh):
 * 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x / (1 + exp(-2u)) (the same
 * function: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))) with an exp of its own (Cody-Waite reduction
 * by ln 2, a degree-7 polynomial, the power of two put in the exponent bits), no libm call: the
 * AVX-512 kernel (arch/eltwise_avx512.c) runs these very operations in its lanes, so every table
 * gives the same bits. -2u is clamped to [-87, 87]: below, exp(-2u) < 2^-125 and the result is x;
 * at the top (x below about -10, where |gelu| < 2e-37, and NaN) the result is x * 0.
 * Error, measured over x in [-12, 12] every 2^-12 and [-1, 1] every 2^-20 (tests/test_kernels.py):
 * within 5.2e-7 absolute of the exact (float64) gelu_tanh, about one ulp of the result near
 * x = 4.7, and 2e-6 relative where |gelu| > 1e-6; 0.5 x (1 + tanhf(u)) with glibc's tanhf (the
 * formula before) is within 4.4e-7 absolute on the [-12, 12] grid, and the two differ by at most
 * 4.8e-7. No FMA: a*b+c is two
 * roundings in both versions (gcc does not contract under -std=c11; clang is told by the pragma). */
#define IG_GELU_M2K  (-1.5957691216057308f)   /* -2 sqrt(2/pi) */
#define IG_EXP_LOG2E 1.44269504088896341f
#define IG_EXP_LN2HI 0.693359375f             /* ln 2 = LN2HI + LN2LO, LN2HI with 9 bits: n*LN2HI exact */
#define IG_EXP_LN2LO (-2.12194440e-4f)
#define IG_EXP_P0 1.9875691500E-4f            /* exp(r) = 1 + r + r^2 (P5 + P4 r + ... + P0 r^5) */
#define IG_EXP_P1 1.3981999507E-3f
#define IG_EXP_P2 8.3334519073E-3f
#define IG_EXP_P3 4.1665795894E-2f
#define IG_EXP_P4 1.6666665459E-1f
#define IG_EXP_P5 5.0000001201E-1f
static inline float ig_gelu_tanh_f32(float x) {
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
    float z = IG_GELU_M2K * (x + 0.044715f * (x * x * x));
    z = z < 87.0f ? z : 87.0f;
    z = z > -87.0f ? z : -87.0f;
    const float n = floorf(z * IG_EXP_LOG2E + 0.5f);
    const float r = (z - n * IG_EXP_LN2HI) - n * IG_EXP_LN2LO;
    float p = IG_EXP_P0;
    p = p * r + IG_EXP_P1;
    p = p * r + IG_EXP_P2;
    p = p * r + IG_EXP_P3;
    p = p * r + IG_EXP_P4;
    p = p * r + IG_EXP_P5;
    float e = (p * (r * r) + r) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    e = e * scale;
    return z < 87.0f ? x / (1.0f + e) : x * 0.0f;
}

/* The epilogue every matmul applies to its dot v at out[t, n]: with an up projection (w2, the SwiGLU
 * form) silu(v) * u, u being the dot with w2; else v + bias[n] + res[t, n], each when given. One
 * definition, so every kernel rounds it alike; `a` is an ig_matmul_args. */
static inline float ig_matmul_epilogue(float v, float u, int swiglu, const float *bias,
                                       const float *res_row, int n) {
    if (swiglu) return ig_silu_f32(v) * u;
    if (bias) v += bias[n];
    if (res_row) v += res_row[n];
    return v;
}
#define IG_MATMUL_EPILOGUE(a, v, u, t, n)                                                        \
    ((a)->gate ? ig_silu_f32((a)->gate[(size_t)(t) * (a)->ldo + (n)]) * (v)                     \
               : ig_matmul_epilogue((v), (u), (a)->w2 != NULL, (a)->bias,                       \
                                    (a)->res ? (a)->res + (size_t)(t) * (a)->ldr : NULL, (n)))

/* ---- the executor: a lowered instruction tape run over one planned arena -------------------- */
/* One instruction, byte for byte a row of ignis.plan.tape.Tape.to_records(). */
#define IG_MAX_ARGS 4
#define IG_MAX_WEIGHTS 8
#define IG_MAX_INTS 6
#define IG_MAX_FLOATS 2
typedef struct {
    int32_t opcode, n_args, n_weights, pad;
    int32_t out_space, out_rows;            /* rows: >= 0 constant, -1 = T, -2 = R */
    int64_t out_where, out_cols;
    int32_t arg_space[IG_MAX_ARGS], arg_rows[IG_MAX_ARGS];
    int64_t arg_where[IG_MAX_ARGS], arg_cols[IG_MAX_ARGS];
    int32_t weight[IG_MAX_WEIGHTS];
    int64_t ints[IG_MAX_INTS];
    double  floats[IG_MAX_FLOATS];
    int64_t scratch_bytes;
} ig_instr;

enum { IG_SPACE_ARENA = 0, IG_SPACE_INPUT = 1, IG_SPACE_OUTPUT = 2 };
enum { IG_ROWS_T = -1, IG_ROWS_R = -2 };

/* Opcodes: ignis.ir.ops.OPS[name].opcode (never renumbered), one row each in ops.def. */
enum {
#define IG_OP(NAME, name, opcode, n_args, w_min, w_max) IG_OP_##NAME = opcode,
#include "ops.def"
#undef IG_OP
};
/* One past the last opcode: opcodes run 1..IG_OP_COUNT-1 (0 is none). */
enum {
    IG_OP_COUNT = 1
#define IG_OP(NAME, name, opcode, n_args, w_min, w_max) + 1
#include "ops.def"
#undef IG_OP
};

/* An op's row of ops.def: what check_instr holds each instruction to. */
typedef struct {
    const char *name;      /* the IR op's name, "rope" */
    int         opcode;
    int         n_args;    /* activation operands */
    int         w_min, w_max;   /* weights */
} ig_op_info;
const ig_op_info *ig_op_info_of(int opcode);   /* NULL for an opcode this build does not know */

typedef struct {
    const ig_instr      *instrs;       /* copied at creation */
    int                  n_instrs;
    const float *const  *weights;      /* f32, row-major; pointers copied, memory stays the caller's */
    /* per weight, the form its matmuls read (packing IG_PACK_F32: its f32 rows, w unused), or
     * NULL: all f32. A SwiGLU pair (linear_swiglu: gate w, up w2) whose packings differ runs both
     * on their f32 rows; ignis's converters pack a pair alike, but a GGUF file may hold gate and
     * up in types of which only one has an IG_WX_* layout. */
    const ig_packed_weight *packed;
    const int64_t       *weight_rows;  /* rows (first dimension) of each weight */
    const int64_t       *weight_elems; /* elements of each weight */
    int                  n_weights;
    int                  n_inputs, n_outputs;
    int64_t              arena_bytes;  /* activations */
    int64_t              scratch_bytes;/* placed right after the activations */
    int                  max_T, max_R, max_ctx;
    int                  n_seq;        /* KV cache slots: independent sequences one step can mix */
    const int32_t       *kv_widths;    /* per layer index: n_kv_heads*head_dim, 0 = no cache */
    int                  n_kv_layers;
    int                  kv_f16;       /* 1: KV cache rows stored as IEEE half (half the memory) */
    const ig_kernel_table *kernels;
} ig_model_desc;

typedef struct ig_model ig_model;

/* Check the tape against the description and allocate arena + scratch + KV cache in one block.
 * On failure *out is NULL and err (err_len bytes) says which instruction and why. */
ig_status ig_model_create(ig_model **out, const ig_model_desc *desc, char *err, int err_len);
void      ig_model_free(ig_model *m);
/* One forward step for T tokens (R logit rows). inputs[i] points at the i-th tape input (i32 or
 * f32, T or R rows), outputs[i] at caller buffers sized for R (or T) rows. seq:(T,) gives each
 * row's KV slot in 0..n_seq-1 (NULL: all slot 0), so one step (one pass over the weights) can
 * carry rows of several sequences: a batch of decodes, or decodes beside a prefill chunk. Rows of
 * one slot see each other causally by position. Never allocates.
 * On failure, *failed is the instruction index (-1: before any) and ig_model_error() says why. */
ig_status ig_model_step(ig_model *m, const void *const *inputs, float *const *outputs, int T, int R,
                        const int32_t *seq, int n_threads, int *failed);
/* Copy the keys and values of positions 0..n_positions-1 of KV slot src_seq into slot dst_seq
 * (every layer; a sliding-window ring copies the rows holding those positions that it keeps),
 * so dst continues from position n_positions without running them (n > 1 choices share their
 * prompt). The caller keeps each slot's length; src must still hold those positions (a ring
 * keeps them only while src has not run past n_positions). dst == src copies nothing.
 * IG_ERR_ARG (ig_model_error says why) for a slot outside 0..n_seq-1 or n outside 0..max_ctx. */
ig_status ig_model_kv_copy(ig_model *m, int dst_seq, int src_seq, int n_positions);
/* Profile the steps: while ns_per_instr (n_instrs entries, the caller's) is set, every step adds
 * each instruction's wall time to its entry (the op's kernels and its threads' join). NULL stops. */
void      ig_model_profile(ig_model *m, int64_t *ns_per_instr);
const char *ig_model_error(const ig_model *m);
int64_t   ig_model_bytes(const ig_model *m);       /* the one allocation: arena+scratch+KV */
size_t    ig_instr_size(void);

#ifdef __cplusplus
}
#endif
#endif /* IGNIS_H */
