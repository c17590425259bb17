/* x86.h — the x86-64 kernels of csrc/arch/ (avx2.c, avx512.c, each compiled with its own -m
 * flags): their declarations, for the tables in dispatch.c, and what the arch files share. Not part
 * of the C ABI (ignis.h); setup.py compiles these files, and defines IGNIS_ARCH_X86, only for an
 * x86-64 target. */
#ifndef IGNIS_ARCH_X86_H
#define IGNIS_ARCH_X86_H

#include "../ignis.h"

/* the templates' prefetch hints (arch/matmul_tmpl.h): the line at p into L2, into L1 */
#define IG_PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#define IG_PREFETCH_L1(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

void    ig_matmul_f32_avx2(const ig_matmul_args *a, int n_threads);
void    ig_matmul_f32_avx512(const ig_matmul_args *a, int n_threads);
void    ig_matmul_q8_avx2(const ig_matmul_args *a, int n_threads);
void    ig_matmul_q4_avx2(const ig_matmul_args *a, int n_threads);
void    ig_matmul_bf16_avx2(const ig_matmul_args *a, int n_threads);
void    ig_matmul_bf16_avx512(const ig_matmul_args *a, int n_threads);
void    ig_matmul_q8_avx512vnni(const ig_matmul_args *a, int n_threads);
void    ig_matmul_q4_avx512vnni(const ig_matmul_args *a, int n_threads);
void    ig_matmul_x16_avx512vnni(const ig_matmul_args *a, int n_threads);
void    ig_matmul_x16_avx2(const ig_matmul_args *a, int n_threads);
void    ig_eltwise_f32_avx2(float *out, const float *x, const float *y, int op, int T, int dim,
                            int n_threads);
void    ig_eltwise_f32_avx512(float *out, const float *x, const float *y, int op, int T, int dim,
                              int n_threads);
void    ig_quantize_q8_rows_avx2(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K);
void    ig_quantize_x16_rows_avx2(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                                  int K);
void    ig_quantize_q8_rows_avx512(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K);
void    ig_quantize_x16_rows_avx512(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                                    int K);
void    ig_attention_f32_avx2(float *out, int64_t ldo, const float *q, int64_t ldq,
                              const void *k_cache, const void *v_cache, int kv_f16,
                              const int32_t *pos, const int32_t *seq, float *scratch, int T,
                              int n_heads, int n_kv_heads, int head_dim, int max_ctx, int kv_rows,
                              float scale, int window, int n_threads);
void    ig_attention_f32_avx512(float *out, int64_t ldo, const float *q, int64_t ldq,
                                const void *k_cache, const void *v_cache, int kv_f16,
                                const int32_t *pos, const int32_t *seq, float *scratch, int T,
                                int n_heads, int n_kv_heads, int head_dim, int max_ctx, int kv_rows,
                                float scale, int window, int n_threads);

#endif /* IGNIS_ARCH_X86_H */
