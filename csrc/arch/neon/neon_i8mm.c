/* neon_i8mm.c — the integer matmuls with vmmlaq_s32 (FEAT_I8MM: armv8.6-a cores, Apple M2 and
 * later, Graviton 3+): a 2x8 by 8x2 int8 product per instruction, so pairs of activation rows (a
 * prefill) go through it; a lone row takes vdotq_s32. Compiled with
 * -march=armv8.2-a+dotprod+i8mm; reachable only through the neon_i8mm table. */
#if defined(__aarch64__) || defined(_M_ARM64)
#include <arm_neon.h>

#include "neon.h"

#define IG_NDOT(acc, w, x) vdotq_s32((acc), (w), (x))
#define IG_NMMLA 1
#define FN(name) name##_neon_i8mm
#include "qdot_tmpl.h"
#endif
