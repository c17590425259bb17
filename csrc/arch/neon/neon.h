/* neon.h — the AArch64 kernels of csrc/arch/neon/ (neon.c, neon_dotprod.c, neon_i8mm.c, each
 * compiled with its own -march flags): their declarations, for the tables in dispatch.c. Not part
 * of the C ABI (ignis.h); setup.py compiles these files, and defines IGNIS_ARCH_NEON, only for an
 * aarch64 target.
 *
 * The integer matmuls (q8, q4, x16) of all three files give the portable twins' results bit for
 * bit: their integer dots are exact whatever the instruction (widening multiplies, vdotq_s32 or
 * vmmlaq_s32), and each row's float accumulation is the twin's, operation for operation, in the
 * twin's order (one row per vector lane). That holds with -ffp-contract=off, which setup.py gives
 * every aarch64 source (the twins included). */
#ifndef IGNIS_ARCH_NEON_H
#define IGNIS_ARCH_NEON_H

#include "../../ignis.h"

/* neon.c: armv8-a (Advanced SIMD, in every AArch64 CPU) */
void ig_matmul_f32_neon(const ig_matmul_args *a, int n_threads);
void ig_matmul_bf16_neon(const ig_matmul_args *a, int n_threads);
void ig_matmul_q8_neon(const ig_matmul_args *a, int n_threads);
void ig_matmul_q4_neon(const ig_matmul_args *a, int n_threads);
void ig_matmul_x16_neon(const ig_matmul_args *a, int n_threads);
void ig_quantize_q8_rows_neon(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K);
void ig_quantize_x16_rows_neon(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                               int K);
void ig_attention_f32_neon(float *out, int64_t ldo, const float *q, int64_t ldq,
                           const void *k_cache, const void *v_cache, int kv_f16,
                           const int32_t *pos, const int32_t *seq, float *scratch, int T,
                           int n_heads, int n_kv_heads, int head_dim, int max_ctx, int kv_rows,
                           float scale, int window, int n_threads);

/* neon_dotprod.c: armv8.2-a + dotprod (vdotq_s32) */
void ig_matmul_q8_neon_dotprod(const ig_matmul_args *a, int n_threads);
void ig_matmul_q4_neon_dotprod(const ig_matmul_args *a, int n_threads);
void ig_matmul_x16_neon_dotprod(const ig_matmul_args *a, int n_threads);

/* neon_i8mm.c: armv8.2-a + dotprod + i8mm (vmmlaq_s32 for pairs of activation rows) */
void ig_matmul_q8_neon_i8mm(const ig_matmul_args *a, int n_threads);
void ig_matmul_q4_neon_i8mm(const ig_matmul_args *a, int n_threads);
void ig_matmul_x16_neon_i8mm(const ig_matmul_args *a, int n_threads);

#endif /* IGNIS_ARCH_NEON_H */
