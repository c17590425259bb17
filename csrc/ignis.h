/* ignis.h — the whole C ABI of the ignis core.
 *
 * Python (ignis/_core.pyx) talks to C only through what this header declares. Kernels follow one
 * convention: output first, const inputs next, sizes last, a shape comment on every pointer.
 * Nothing here allocates on a hot path or exits the process; failures are status codes.
 */
#ifndef IGNIS_H
#define IGNIS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------------------------- */
typedef enum {
    IG_OK = 0,
    IG_ERR_ARG = 1,          /* an argument is out of range */
    IG_ERR_UNSUPPORTED = 2,  /* the CPU or build lacks what was asked for */
} ig_status;

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
};
#define IG_CPU_N_FEATURES 16

uint32_t    ig_cpu_features(void);              /* bitmask of IG_CPU_*; OS support checked (XCR0) */
const char *ig_cpu_feature_name(int bit);       /* "avx2", ...; NULL past the end */

/* ---- kernel tables ------------------------------------------------------------------------ */
/* One table per ISA level. A table is eligible only when every feature in `requires` is present.
 * Adding an op: declare its _ref in ops/ below, add a slot here, fill the slot in every table in
 * dispatch.c (NULL is not allowed: a table without an ISA version points at the portable one),
 * wrap it in ignis/_core.pyx, and add it to tests/test_kernels.py. */
typedef struct {
    /* out = sum(x[i] * y[i]); x,y:(n,) */
    float   (*dot_f32)(const float *x, const float *y, int n);
    /* out[r] = sum_c w[r,c] * x[c]; out:(rows,) w:(rows,cols) row-major x:(cols,) */
    void    (*gemv_f32)(float *out, const float *w, const float *x, int rows, int cols, int n_threads);
    /* out = sum(x[i] * y[i]) in int32; x,y:(n,) int8 */
    int32_t (*dot_i8)(const int8_t *x, const int8_t *y, int n);
} ig_kernel_fns;

typedef struct {
    const char   *name;      /* "generic", "avx2", "avx512", "avx512_vnni" */
    uint32_t      requires;  /* IG_CPU_* bitmask */
    int           priority;  /* higher wins among eligible tables */
    ig_kernel_fns fns;
} ig_kernel_table;

int                    ig_kernel_table_count(void);
const ig_kernel_table *ig_kernel_table_at(int i);          /* NULL when out of range */
const ig_kernel_table *ig_kernel_table_find(const char *name);
int                    ig_kernel_table_eligible(const ig_kernel_table *t);
const ig_kernel_table *ig_kernel_table_best(void);         /* highest-priority eligible table */

/* ---- threads ------------------------------------------------------------------------------ */
int ig_openmp_enabled(void);     /* 1 when built with OpenMP */
int ig_max_threads(void);

/* ---- portable reference kernels (csrc/ops/) ----------------------------------------------- */
float   ig_dot_f32_ref(const float *x, const float *y, int n);                      /* x,y:(n,) */
void    ig_gemv_f32_ref(float *out, const float *w, const float *x, int rows, int cols,
                        int n_threads);                     /* out:(rows,) w:(rows,cols) x:(cols,) */
int32_t ig_dot_i8_ref(const int8_t *x, const int8_t *y, int n);                     /* x,y:(n,) */

/* ---- ISA-specific versions (csrc/arch/, compiled with their own flags) -------------------- */
#if defined(__x86_64__) || defined(_M_X64)
float   ig_dot_f32_avx2(const float *x, const float *y, int n);
void    ig_gemv_f32_avx2(float *out, const float *w, const float *x, int rows, int cols, int n_threads);
int32_t ig_dot_i8_avx2(const int8_t *x, const int8_t *y, int n);
float   ig_dot_f32_avx512(const float *x, const float *y, int n);
void    ig_gemv_f32_avx512(float *out, const float *w, const float *x, int rows, int cols, int n_threads);
int32_t ig_dot_i8_avx512(const int8_t *x, const int8_t *y, int n);
int32_t ig_dot_i8_avx512vnni(const int8_t *x, const int8_t *y, int n);
#endif

#ifdef __cplusplus
}
#endif
#endif /* IGNIS_H */
